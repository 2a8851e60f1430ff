"""The grader's per-row bounds as a repro script carries them: written out for a small case, recomputed through
attnfuzz for a case whose inputs the script regenerates too."""

from __future__ import annotations

import torch

from attnfuzz.backends.source import guarded_import, literal
from attnfuzz.oracles.grade import Oracle, check_out, gradient_check, lse_check
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize


def get_family(entry) -> str:
    """The grading family of the entry's backend (its bounds depend on it); "default" for a name not registered."""
    from attnfuzz.backends import get
    try:
        return get(entry.backend, entry.device).family
    except ValueError:
        return "default"


def row_bounds(oracle: Oracle, family: str) -> dict[str, torch.Tensor]:
    """Every row's bound as the grader takes it (inf: a row not graded): "out", "lse" and, with gradients, "dq", "dk"
    and "dv"."""
    bounds = {"out": check_out(oracle, oracle.ref.out, oracle.ref.out, family).row_bounds}
    lse = lse_check(oracle, oracle.ref.lse, family).row_bounds  # None: no row to grade
    bounds["lse"] = torch.full_like(oracle.ref.lse, float("inf")) if lse is None else lse
    if oracle.case.grads:
        bounds.update({name: gradient_check(oracle, name, getattr(oracle.ref, name), family).row_bounds
                       for name in ("dq", "dk", "dv")})
    return bounds


def graded_bounds(case: dict, backend: str, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The grader's bounds of every row (see row_bounds) of the case `case` (Case.to_dict) under `backend`'s family,
    recomputed from its seed: what the script of a case too large to hold them calls."""
    from types import SimpleNamespace
    drawn = Case.from_dict(case)
    family = get_family(SimpleNamespace(backend=backend, device=device))
    return row_bounds(Oracle.of(drawn, materialize(drawn, "cpu")), family)


def bounds_source(bounds: dict[str, torch.Tensor], small: bool) -> str:
    """ROW_BOUNDS, BOUND and LSE_BOUNDS (and GRAD_ROW_BOUNDS with gradients): written out for a small case, recomputed
    by attnfuzz's grader for one whose inputs are regenerated too (a case of 131,071 keys held 64 MB of them)."""
    out = bounds["out"]
    largest = float(out[torch.isfinite(out)].max()) if bool(torch.isfinite(out).any()) else 0.0
    grads = [n for n in ("dq", "dk", "dv") if n in bounds]
    if small:
        row, lse = literal(out), literal(bounds["lse"])
        grad = "{" + ", ".join(f"{n!r}: {literal(bounds[n])}" for n in grads) + "}"
        text = ""
    else:
        row, lse = "_BOUNDS['out']", "_BOUNDS['lse']"
        grad = "{" + ", ".join(f"{n!r}: _BOUNDS[{n!r}]" for n in grads) + "}"
        text = (guarded_import("from attnfuzz.store.repro_bounds import graded_bounds",
                               "too many bounds to write out: recomputed")
                + "_BOUNDS = graded_bounds(CASE, BACKEND, DEVICE)\n")
    text += (f"ROW_BOUNDS = {row}  # per output row (batch, query, head): k * naive same-dtype error + rounding floor\n"
             f"BOUND = {largest!r}  # the largest, for the summary line\n"
             f"LSE_BOUNDS = {lse}  # per LSE row (batch, head, query): the grader's bound (inf: not graded)")
    if grads:
        text += (f"\nGRAD_ROW_BOUNDS = {grad}  # per dQ row (batch, query, head) and dK / dV row (batch, key, KV head):"
                 " the grader's bound")
    return text
