"""The second signal: does the gathered CP output agree with a non-CP run of the same backend?

This is the check TransformerEngine's own CP suite relies on, and it is blind to any error both runs share (an
all-zero kernel agrees with itself). attnfuzz therefore never grades with it: the verdict comes from the float64
oracle, and this agreement is only reported next to it, where a disagreement points at the CP plumbing (sharding,
rotation, merge) rather than the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case

# Loose bounds in the spirit of TE's CP suite (atol = rtol): a sanity comparison, not a precision test.
AGREE_TOL = {"float16": 5e-3, "bfloat16": 2.5e-2, "float32": 1e-5, "float64": 1e-12}


@dataclass(frozen=True)
class Agreement:
    """max |cp - nocp| over valid query rows, and whether it is within tol * (1 + max |nocp|)."""

    max_abs_diff: float
    tol: float
    agree: bool

    def describe(self) -> str:
        word = "agree" if self.agree else "DISAGREE"
        return f"cp_vs_nocp (second signal, not graded): max|diff|={self.max_abs_diff:.3e} tol={self.tol:.1e} {word}"


def cp_vs_nocp(case: Case, cp: Output, nocp: Output) -> Agreement:
    """Compare the CP output with the same backend's non-CP output on the rows the oracle grades."""
    rows = torch.arange(case.sq)[None, :] < torch.tensor(case.lens_q)[:, None]        # [b, sq]
    a, b = cp.out.detach().cpu().to(torch.float64)[rows], nocp.out.detach().cpu().to(torch.float64)[rows]
    if a.shape != b.shape:
        return Agreement(float("inf"), 0.0, False)
    diff = (a - b).abs().nan_to_num(nan=float("inf")).max().item() if a.numel() else 0.0
    scale = b.abs().nan_to_num(nan=0.0, posinf=0.0).max().item() if b.numel() else 0.0
    tol = AGREE_TOL[case.dtype] * (1.0 + scale)
    return Agreement(diff, tol, diff <= tol)
