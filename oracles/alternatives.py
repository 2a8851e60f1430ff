"""What the graders share below grade.py and probe.py: which rows and keys are graded, the FAIL verdict (SHAPE among
them), and the alternative references (the plausible mistakes) a failing output is graded against to name what went wrong."""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.tolerance import Check
from attnfuzz.strategies.case import Case


@lru_cache(maxsize=16)  # asked several times per graded case; callers only read it
def valid_rows(case: Case, device) -> torch.Tensor:
    """[b, sq] True where a query row belongs to its sequence (rows past seqlens_q are padding)."""
    rows = torch.arange(case.sq, device=device)
    return rows[None, :] < torch.tensor(case.lens_q, device=device)[:, None]


def valid_keys(case: Case, device) -> torch.Tensor:
    keys = torch.arange(case.skv, device=device)
    return keys[None, :] < torch.tensor(case.lens_kv, device=device)[:, None]


def fail(diagnosis: str, message: str, c: Check | None = None, ratio: float = math.inf, checks=()) -> V.Verdict:
    worst = V.Worst(c.name, c.index, c.got, c.expected) if c else None
    return V.Verdict(V.FAIL, diagnosis, message, worst, ratio, tuple(checks))


# The contract's axes of each tensor a backend returns
AXES = {"out": "b, sq, h, d_v", "lse": "b, h, sq", "dq": "b, sq, h, d_qk", "dk": "b, skv, hk, d_qk",
        "dv": "b, skv, hk, d_v"}


def wrong_shape(name: str, got: torch.Tensor, want: torch.Tensor) -> V.Verdict | None:
    """FAIL:SHAPE when a returned tensor's shape is not the contract's (its axes in another order, say), else None;
    checked before anything indexes it by the contract's axes."""
    if tuple(got.shape) == tuple(want.shape):
        return None
    return fail(V.SHAPE, f"{name} has shape {tuple(got.shape)}, expected {tuple(want.shape)} ({AXES[name]})")


def alternatives(case: Case) -> list[tuple[str, str, dict]]:
    """(diagnosis, description, reference() overrides) for each plausible mistake that differs from the case."""
    alts = []
    masked = case.left is not None or case.right is not None or case.alibi_slopes is not None
    if masked and any(q != k for q, k in zip(case.lens_q, case.lens_kv)):
        other = "top_left" if case.alignment == "bottom_right" else "bottom_right"
        alts.append((V.MASK_ALIGNMENT, f"matches alignment={other!r}", {"case": case.replace(alignment=other)}))
    for side, bound in (("left", case.left), ("right", case.right)):
        if bound is None:
            continue
        for moved in (bound + 1, bound - 1):
            bounds = (moved, case.right) if side == "left" else (case.left, moved)
            alts.append((V.WINDOW_OFF_BY_ONE, f"matches the {side} bound {moved} instead of {bound}",
                         {"bounds": bounds}))
    if case.left is not None or case.right is not None:
        alts.append((V.MASK_IGNORED, "matches attention with no causal mask or window at all (the band was dropped)",
                     {"case": case.replace(causal=False, window=(None, None))}))
    if 1 < case.hk < case.h:
        alts.append((V.GQA_MAPPING, "matches query head i reading KV head i % hk (not i // (h // hk))",
                     {"head_map": "mod"}))
    scales = {}
    if case.d_qk != case.d_v:
        scales[1 / math.sqrt(case.d_v)] = "1/sqrt(d_v)"
    if case.scale is not None:
        scales[1 / math.sqrt(case.d_qk)] = "1/sqrt(d_qk) (the custom scale was ignored)"
    scales.setdefault(1.0, "1 (no scaling)")
    for value, what in scales.items():
        if not math.isclose(value, case.softmax_scale):
            alts.append((V.SCALE, f"matches scale {what} instead of {case.softmax_scale:.6g}", {"scale": value}))
    return alts
