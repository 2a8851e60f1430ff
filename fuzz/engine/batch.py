"""Batch invariance: one sequence's output, bit for bit, the same alone as inside its batch.

A serving stack batches a request with whatever else is in flight; a kernel is batch invariant when the bits it
gives a sequence do not depend on that company (a split count or a reduction order chosen from the batch's total
length, a tile schedule sized to the batch, break it while staying well inside every tolerance).

For a checked case (`checked`: b > 1 and seed % CHECK_EVERY == 0, so one case in CHECK_EVERY of those with a batch;
the choice shrinks with the seed toward 0, which is checked, so a shrunk failure stays checked) the backend runs
two more compositions of the same values:

- alone: the chosen sequence (`chosen`) as a batch of one at its own lengths (sq = its valid queries, skv = its
  valid keys; seqlens kept, at those lengths, where the case has them; a paged case gets its own pages, no shared
  prefix), in the case's memory format;
- reversed: the whole batch in the opposite order (its seqlens too), each sequence compared with itself.

Every tensor both runs give (out, lse, dq, dk, dv) is compared bitwise on the sequence's valid rows. A backend that
declares `batch_invariant` gets FAIL:BATCH_VARIANT when a bit differs (oracles/verdict.py); for any other backend
the outcome is an observation on the verdict (`Verdict.batch_invariant`), counted in the run's tally and the
coverage map, never a failure. A composition the backend refuses (unsupported, Unsupported, or an exception of its
own) leaves the case unchecked, with the reason among the verdict's checks. So does one that would build a kernel
the case did not (its compile key differs: a batch of one under a key that holds the batch size, the reversed
lengths of a kernel built per shape), for a backend that claims nothing: an observation is not worth a compile of
seconds (a fifth of compiled flex's cases on a CPU were such checks, 42 % of its time).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from attnfuzz.backends.base import Backend, Hang, Unsupported
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

CHECK_EVERY = 4  # one case in this many of those with b > 1 is checked (by its seed): three more runs at most


def _sequences(case: Case) -> list[int]:
    """The sequences that can stand alone: at least one query and one key."""
    return [n for n, (sq_n, skv_n) in enumerate(zip(case.lens_q, case.lens_kv)) if sq_n >= 1 and skv_n >= 1]


def checked(case: Case) -> bool:
    return case.b > 1 and case.seed % CHECK_EVERY == 0 and case.fp8 is None and bool(_sequences(case))


def chosen(case: Case) -> int:
    """The sequence run alone: one of those that can stand alone, picked by the seed."""
    candidates = _sequences(case)
    return candidates[(case.seed // CHECK_EVERY) % len(candidates)]


def alone(case: Case, n: int) -> Case:
    """Sequence n as a batch of one at its own lengths."""
    sq_n, skv_n = case.lens_q[n], case.lens_kv[n]
    return case.replace(b=1, sq=sq_n, skv=skv_n, shared_prefix_pages=0,
                        seqlens_q=(sq_n,) if case.seqlens_q is not None else None,
                        seqlens_kv=(skv_n,) if case.seqlens_kv is not None else None)


def reversed_batch(case: Case) -> Case:
    flip = (lambda lens: tuple(reversed(lens)) if lens is not None else None)
    return case.replace(seqlens_q=flip(case.seqlens_q), seqlens_kv=flip(case.seqlens_kv))


def _laid_out(case: Case, x: torch.Tensor, kv: bool) -> torch.Tensor:
    """Values of a logical [b, s, heads, d] tensor in a fresh buffer of the case's memory format."""
    if case.memory == "transposed":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if case.memory == "expanded_kv" and kv:
        return x[:, :, :1].contiguous().expand(x.shape)
    return x.contiguous()


def _rebatched(case: Case, t: Tensors, rows: list[int], sq: int, skv: int) -> Tensors:
    """The tensors of a batch made of sequences `rows` of `t`, cut to sq queries and skv keys."""
    index = torch.tensor(rows, device=t.q.device)

    def pick(x, *cuts):
        return x.index_select(0, index)[(slice(None), *cuts)] if x is not None else None

    return Tensors(q=_laid_out(case, pick(t.q, slice(sq)), False), k=_laid_out(case, pick(t.k, slice(skv)), True),
                   v=_laid_out(case, pick(t.v, slice(skv)), True),
                   mask=None if t.mask is None else pick(t.mask, slice(None), slice(sq), slice(skv)).contiguous(),
                   sink=t.sink, alibi=t.alibi, dout=None if t.dout is None else pick(t.dout, slice(sq)).contiguous())


def _parts(output: V.Output, n: int, sq_n: int, skv_n: int) -> dict[str, torch.Tensor]:
    """Sequence n's valid rows of each tensor an output holds."""
    cuts = {"out": (n, slice(sq_n)), "lse": (n, slice(None), slice(sq_n)), "dq": (n, slice(sq_n)),
            "dk": (n, slice(skv_n)), "dv": (n, slice(skv_n))}
    return {name: getattr(output, name)[cut] for name, cut in cuts.items() if getattr(output, name) is not None}


def bits(x: torch.Tensor) -> torch.Tensor:
    """A tensor's bit pattern (NaN-safe equality): its bytes as integers of the same width."""
    return x.detach().contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def _differences(what: str, batched: dict, composed: dict) -> list[str]:
    """A line per tensor of one sequence whose bits differ between the batch and another composition `what`."""
    lines = []
    for name in batched.keys() & composed.keys():
        a, b = batched[name], composed[name]
        if a.shape != b.shape:
            lines.append(f"{name} of {what} has shape {tuple(b.shape)}, in the batch {tuple(a.shape)}")
            continue
        differ = bits(a) != bits(b)
        if differ.any():
            delta = (a.double() - b.double()).abs().nan_to_num(nan=float("inf")).max().item()
            lines.append(f"{name} of {what} differs from the batch's in {int(differ.sum())} of {differ.numel()} "
                         f"elements, by up to {delta:.3g}")
    return sorted(lines)


@dataclass(frozen=True)
class BatchCheck:
    """The outcome of one case's check: the sequence run alone, and a line per tensor that differed (none: the
    backend was batch invariant on this case), or `refused` when a composition could not run."""

    sequence: int
    differences: tuple[str, ...] = ()
    refused: str = ""

    @property
    def invariant(self) -> bool:
        return not self.differences


def compare(backend: Backend, case: Case, tensors: Tensors, batched: V.Output) -> BatchCheck:
    """Run the chosen sequence alone and the batch reversed; compare their bits with `batched` (the case's output)."""
    n = chosen(case)
    sq_n, skv_n = case.lens_q[n], case.lens_kv[n]
    single, flipped = alone(case, n), reversed_batch(case)
    order = list(reversed(range(case.b)))
    runs = [(f"sequence {n} alone (b=1, sq={sq_n}, skv={skv_n})", single,
             _rebatched(case, tensors, [n], sq_n, skv_n), [(0, n)]),
            ("the batch reversed", flipped, _rebatched(case, tensors, order, case.sq, case.skv),
             [(case.b - 1 - m, m) for m in _sequences(case)])]
    key = backend.compile_key(case)
    if key is not None and not backend.batch_invariant:
        for what, composed, *_ in runs:
            if backend.compile_key(composed) != key:
                return BatchCheck(n, refused=f"{what} would build another kernel configuration (compile key) than "
                                             f"the case's, and {backend.name} claims no batch invariance")
    differences: list[str] = []
    for what, composed, inputs, pairs in runs:
        reason = backend.unsupported(composed)
        if reason is not None:
            return BatchCheck(n, refused=f"{what} is refused: {reason}")
        try:
            output = backend.run(composed, inputs)
            if output.out.is_cuda:   # an asynchronous fault of this run is its own, not the next case's (harness)
                torch.cuda.synchronize(output.out.device)
        except (Unsupported, Hang) as e:
            return BatchCheck(n, refused=f"{what} is refused: {type(e).__name__}: {e}")
        except Exception as e:  # a crash of a composition that is not the drawn case: noted, not graded here
            return BatchCheck(n, refused=f"{what} raised {type(e).__name__}: {str(e)[:200]}")
        for position, m in pairs:
            label = what if what.startswith("sequence") else f"sequence {m} in {what} (at {position})"
            differences += _differences(label, _parts(batched, m, case.lens_q[m], case.lens_kv[m]),
                                        _parts(output, position, case.lens_q[m], case.lens_kv[m]))
    return BatchCheck(n, tuple(differences))


def checked_verdict(backend: Backend, case: Case, tensors: Tensors, batched: V.Output,
                    verdict: V.Verdict) -> V.Verdict:
    """The verdict with the batch check's outcome: FAIL:BATCH_VARIANT for a backend that declares batch invariance
    and broke it (a failed grade stays the verdict, with the difference noted), else the observation."""
    check = compare(backend, case, tensors, batched)
    if check.refused:
        return dataclasses.replace(verdict, checks=verdict.checks + (f"batch invariance not checked: {check.refused}",))
    observed = dataclasses.replace(verdict, batch_invariant=check.invariant)
    if check.invariant:
        return observed
    message = "not batch invariant: " + "; ".join(check.differences)
    if not backend.batch_invariant or verdict.failed:
        return dataclasses.replace(observed, checks=verdict.checks + (message,))
    return V.Verdict(V.FAIL, V.BATCH_VARIANT, message, ratio=verdict.ratio, checks=verdict.checks,
                     batch_invariant=False)
