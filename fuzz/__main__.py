"""python -m fuzz: the attnfuzz command line."""

import sys

from fuzz.cli import main

sys.exit(main())
