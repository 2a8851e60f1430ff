"""What torch's SDPA kernels refuse by checks of their own, which its dispatcher does not see, and torch's own words
for a refusal (the adapter, fuzz/backends/sdpa/adapter.py, turns each into Unsupported)."""

from __future__ import annotations

import re

import torch

from attnfuzz.backends.base import Unsupported
from attnfuzz.backends.sdpa.spelling import Spelling


# Checks a kernel makes of its own, after torch's dispatcher chose it: each is a refusal (Unsupported), not a crash.
KERNEL_CHECKS = {
    "is not correctly aligned": "a tensor's pointer; torch's dispatcher does not check alignment",
    "invalid dtype for bias": "the mask's dtype; torch's input check accepts a float32 mask on a half query",
}


def refuse_kernel_check(kernel: str, error: RuntimeError) -> None:
    """A kernel's own check (KERNEL_CHECKS: the memory-efficient kernel's "p.query_ptr is not correctly aligned",
    "invalid dtype for bias") raises Unsupported naming it. Other errors pass."""
    for needle, what in KERNEL_CHECKS.items():
        if needle in str(error):
            raise Unsupported(f"{kernel} refused at call time: {str(error).splitlines()[0]} (the kernel's own check "
                              f"of {what})") from None


def kernel_refusal(kernel: str, spelling: Spelling, query_dtype) -> str | None:
    """What a kernel refuses by its own check that the dispatcher cannot see, known before the call: the
    memory-efficient kernel takes an additive mask only in the query's dtype."""
    if kernel == "EFFICIENT_ATTENTION" and spelling.mask == "float32_mask" and query_dtype != torch.float32:
        what = KERNEL_CHECKS["invalid dtype for bias"]
        return (f"{kernel} refuses spelling {spelling.name!r}: its own check of {what} raises 'invalid dtype for "
                f"bias - should match query's dtype'")
    return None


def torch_reason(caught, error: Exception) -> str:
    """torch's own reasons for a refusal: the warnings it emitted, without the 'Triggered internally' tails."""
    lines = [re.sub(r"\s*\(Triggered internally at .*\)\s*$", "", str(w.message)).strip() for w in caught]
    lines = [ln for ln in lines if ln and "kernel not used because" not in ln]
    return "; ".join(dict.fromkeys(lines)) or str(error).strip()
