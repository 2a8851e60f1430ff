"""Standalone repro scripts for corpus entries: torch and the backend are all they need.

The script embeds the inputs exactly as the fuzzer drew them (for cases up to INLINE elements; larger ones are
regenerated from the seed, which needs attnfuzz importable) and the float64 oracle's output, so it checks the backend
without the oracle. The backend call is the adapter's own `repro_source(case)` when it has one: source defining
`attention(q, k, v)` in the backend's API; otherwise the script calls the adapter through attnfuzz.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from oracles.grade import Oracle, valid_rows
from oracles.tolerance import check
from strategies.materialize import materialize

INLINE = 1 << 16

_ADAPTER_CALL = '''
def attention(q, k, v):
    """No standalone spelling for this backend yet: call it through attnfuzz's adapter."""
    from fuzz.backends import get
    from strategies import Case, materialize
    case = Case.from_dict(CASE)
    t = materialize(case, DEVICE)
    t = type(t)(q=q, k=k, v=v, mask=t.mask, sink=t.sink, alibi=t.alibi, dout=t.dout)
    return get(BACKEND, DEVICE).run(case, t).out
'''


def _literal(x: torch.Tensor) -> str:
    """A tensor as source: exact values (float64 holds every fp16/bf16/fp32 value), its dtype and shape."""
    values = repr(x.detach().cpu().to(torch.float64).flatten().tolist())
    return f"torch.tensor({values}, dtype=torch.float64).reshape({tuple(x.shape)}).to({x.dtype})"


def script(entry) -> str:
    """The repro script's source for one corpus entry."""
    from fuzz.backends import get
    case, device = entry.case, "cpu"
    t = materialize(case, device)
    oracle = Oracle.of(case, t)
    rows = valid_rows(case, device)[:, :, None, None]
    c = check("out", oracle.ref.out, oracle.ref.out, oracle.naive.out, rows, family=get_family(entry),
              quantity="out", dtype=case.dtype, logit_max=oracle.ref.logit_max)
    small = sum(x.numel() for x in (t.q, t.k, t.v, oracle.ref.out)) <= INLINE
    if small:
        inputs = "\n".join(f"{name} = {_literal(x)}.to(DEVICE)" for name, x in (("q", t.q), ("k", t.k), ("v", t.v)))
        expected = f"EXPECTED = {_literal(oracle.ref.out)}"
    else:
        inputs = ("from strategies import Case, materialize  # too large to inline: regenerated from the seed\n"
                  "_t = materialize(Case.from_dict(CASE), DEVICE)\nq, k, v = _t.q, _t.k, _t.v")
        expected = ("from oracles.reference import reference\n"
                    "EXPECTED = reference(Case.from_dict(CASE), _t).out")
    try:
        call = get(entry.backend, entry.device).repro_source(case)  # type: ignore[attr-defined]
    except AttributeError:
        call = None
    rows_list = list(case.lens_q)
    return f'''"""attnfuzz repro: {entry.backend} {entry.verdict.label}
{textwrap.fill(entry.verdict.message, 110)}

Run with: python3 {Path(entry.filename).with_suffix(".py").name}   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = {entry.backend!r}
DEVICE = {entry.device!r}
CASE = {case.to_dict()!r}
VALID_ROWS = {rows_list!r}  # graded query rows per sequence (rows past them are padding)
BOUND = {c.bound!r}  # k * naive same-dtype error + rounding floor, as the fuzzer graded it
{call or _ADAPTER_CALL}
{inputs}
{expected}

out = attention(q, k, v)
out = (out[0] if isinstance(out, tuple) else out).detach().to("cpu", torch.float64)
want = EXPECTED.to("cpu", torch.float64)
rows = torch.arange(out.shape[1])[None, :] < torch.tensor(VALID_ROWS)[:, None]
got, want = out[rows], want[rows]
err = (got - want).abs().max().item() if got.numel() else 0.0
problems = []
if not torch.isfinite(got).all():
    problems.append("non-finite output")
if got.numel() and (got == 0).all() and (want != 0).any():
    problems.append("all-zero output")
if not err <= BOUND:
    problems.append(f"max |out - float64| = {{err:.4g}} > bound {{BOUND:.4g}}")
print(f"{{BACKEND}}: max |out - float64| = {{err:.4g}}, bound {{BOUND:.4g}}", *problems, sep="\\n  ")
sys.exit(1 if problems else 0)
'''


def get_family(entry) -> str:
    from fuzz.backends import get
    try:
        return get(entry.backend, entry.device).family
    except ValueError:
        return "default"


def write_repro(entry, path: Path) -> Path:
    path.write_text(script(entry))
    return path
