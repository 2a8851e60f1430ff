"""The SDPA adapter asks torch's dispatcher about a case on empty tensors of its shapes, in the process that draws the
case. In a campaign lane that process keeps to its share of a shared GPU, and a long case's probe once ended the lane
with an out-of-memory error raised from inside the draw. The probe now holds one mask at a time, and a probe that
still does not fit answers "run it and see": the call refuses what the kernel does not take."""

from __future__ import annotations

import weakref

import pytest
import torch

from attnfuzz.backends import get
from attnfuzz.backends.sdpa import adapter as sdpa_adapter
from attnfuzz.backends.sdpa.spelling import all_spellings
from attnfuzz.engine.harness import _graded
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

# sdpa-flash on the CPU refuses 12 of this case's 100 spellings (a 3-d mask with grouped KV heads)
CASE = Case(b=2, sq=5, skv=7, h=4, hk=2, d_qk=16, d_v=16, dtype="float16", causal=True, alignment="bottom_right")


def _out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 94.00 MiB (a lane's share)")


def test_a_probe_that_runs_out_of_memory_answers_run_it_and_caches_nothing(monkeypatch):
    backend = get("sdpa-flash", "cpu")
    options = all_spellings(CASE)
    monkeypatch.setattr(sdpa_adapter, "skeleton", _out_of_memory)
    assert backend._probe_all(CASE, options) == [None] * len(options)
    assert backend.unsupported(CASE) is None
    monkeypatch.undo()
    answers = backend._probe_all(CASE, options)   # asked again once it fits: the real refusals, not a cached None
    assert sum(a is not None for a in answers) == 12


def test_a_spelling_the_probe_could_not_ask_about_is_refused_by_the_call(monkeypatch):
    backend = get("sdpa-flash", "cpu")
    refused = next(s for s, a in zip(all_spellings(CASE), backend._probe_all(CASE, all_spellings(CASE))) if a)
    case = CASE.replace(spelling=refused.name)
    fresh = get("sdpa-flash", "cpu")
    monkeypatch.setattr(sdpa_adapter, "skeleton", _out_of_memory)
    assert fresh.unsupported(case) is None   # the draw keeps the case
    monkeypatch.undo()
    fresh._probed.clear()
    monkeypatch.setattr(fresh, "_probe_all", lambda case, spellings: [None] * len(spellings))
    verdict = _graded(fresh, case, "cpu")
    assert verdict.status == V.UNSUPPORTED and "refused at call time" in verdict.message


def test_the_probe_holds_one_dense_mask_at_a_time(monkeypatch):
    backend = get("sdpa-flash", "cpu")
    alive, most = [], [0]
    real = sdpa_adapter.formed

    def counted(mask, case, form):
        out = real(mask, case, form)
        alive.extend(weakref.ref(t) for t in {id(mask): mask, id(out): out}.values())
        most[0] = max(most[0], len({r() for r in alive if r() is not None and r() is not mask and r() is not out}))
        return out

    monkeypatch.setattr(sdpa_adapter, "formed", counted)
    backend._probe_all(CASE, all_spellings(CASE))
    assert len(alive) > 4          # several dtypes and forms were asked about
    assert most[0] == 0            # none of the earlier ones was still held when the next was built


@pytest.mark.parametrize("error", [RuntimeError("CUDA error: an illegal memory access"), ValueError("ours")])
def test_only_out_of_memory_is_answered_run_it(monkeypatch, error):
    backend = get("sdpa-flash", "cpu")

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(sdpa_adapter, "skeleton", broken)
    with pytest.raises(type(error)):
        backend._probe_all(CASE, all_spellings(CASE))
