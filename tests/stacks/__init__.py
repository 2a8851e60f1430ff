"""Two kernel modules that will not load into one process, as two GPU stacks with clashing libraries: each imports
alone, and whichever comes second raises ImportError (bench/recall.py must ask each in a process of its own)."""

import sys


def claim(name: str) -> None:
    """Mark this process as holding stack `name`; ImportError if it already holds the other one."""
    held = getattr(sys, "_attnfuzz_test_stack", None)
    if held not in (None, name):
        raise ImportError(f"stack {name} cannot load beside stack {held} (a library of one hides the other's)")
    sys._attnfuzz_test_stack = name
