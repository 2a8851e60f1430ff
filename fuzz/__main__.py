"""python3 -m attnfuzz: the attnfuzz command line."""

import sys

from attnfuzz.cli import main

sys.exit(main())
