"""A kernel module that takes seconds to import, as TE or FA4's CUTLASS DSL do: $ATTNFUZZ_TEST_STARTUP_S (set in the
worker by the test) before its kernel, which segfaults on causal cases, can run."""

import os
import time

from tests.misbehaving import segfault_when_causal  # noqa: F401 (the kernel the tests name)

time.sleep(float(os.environ.get("ATTNFUZZ_TEST_STARTUP_S", "0")))
