"""torch ring attention on 2 gloo ranks, graded against the float64 oracle of the whole sequence.

One pool serves every test in this file (start-up is paid once)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from attnfuzz.backends.cp.adapter import BACKENDS, CPBackend
from attnfuzz.backends.cp.capabilities import LSE_ALIGN, RING_LSE_PADDING, ring_lse_padding_defect
from attnfuzz.backends.cp.cases import cp_cases
from attnfuzz.engine.harness import run_case as run_and_grade  # derandomized tests seed from their source: keep its name
from attnfuzz.backends.cp.pool import CPPool
from attnfuzz.backends.cp.ring import RingEngine, SdpaOps, sdpa_ops
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize

ROTATES = ("allgather", "alltoall")
FAST_DTYPES = ("float32", "bfloat16", "float16")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with CPPool(2, timeout_s=60, hang_dir=tmp_path_factory.mktemp("hangs")) as p:
        yield p


@pytest.fixture(scope="module")
def backends(pool):
    return {rotate: CPBackend(RingEngine(rotate), "cpu", pool=pool) for rotate in ROTATES}


COVERAGE = [
    Case(sq=16, skv=16, h=4, hk=2, d_qk=16, d_v=16, causal=True, grads=True, seed=1),                  # lb on, GQA
    Case(sq=16, skv=16, h=4, hk=2, causal=True, spelling="contiguous", grads=True, seed=2),           # lb off
    Case(sq=12, skv=12, h=2, causal=True, spelling="head_tail", alignment="bottom_right", seed=3),
    Case(b=2, sq=8, skv=12, h=6, hk=2, causal=False, grads=True, scale=0.3, seed=4),                 # cross, GQA
    Case(sq=16, skv=16, h=2, hk=1, causal=True, dtype="bfloat16", grads=True, seed=5),
    Case(sq=4, skv=6, h=2, causal=False, dtype="float16", layout="sbhd", memory="transposed", seed=6),
]


@pytest.mark.parametrize("rotate", ROTATES)
@pytest.mark.parametrize("case", COVERAGE, ids=lambda c: f"{'causal' if c.causal else 'full'}-{c.spelling or 'dflt'}"
                                                          f"-h{c.h}hk{c.hk}-{c.dtype}")
def test_ring_passes_the_oracle(backends, rotate, case):
    backend = backends[rotate]
    tensors = materialize(case)
    output = backend.run(case, tensors)
    verdict = grade(case, tensors, output)
    assert verdict.status == V.PASS, verdict.message
    assert (output.lse is not None) and ((output.dq is not None) == case.grads)  # LSE and grads were graded
    lb = "on" if backend.engine.load_balanced(case) else "off"
    assert f"ring-{rotate}(world=2, load_balance={lb}" in output.ran and "cp_vs_nocp" in output.ran
    assert backend.last_agreement is not None and backend.last_agreement.agree, backend.last_agreement


@pytest.mark.parametrize("rotate", ROTATES)
def test_fuzzed_ring_cases_pass(backends, rotate):
    backend = backends[rotate]
    seen = []

    @settings(max_examples=16, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=cp_cases(backend.engine, dtypes=FAST_DTYPES))
    def check(case):
        verdict = run_and_grade(backend, case)
        seen.append(case)
        assert verdict.status == V.PASS, f"{verdict.label}: {verdict.message}\n{case!r}"

    check()
    assert {c.causal for c in seen} == {True, False}
    assert {backend.engine.load_balanced(c) for c in seen} == {True, False}
    assert any(c.h != c.hk for c in seen) and any(c.grads for c in seen)


def test_float64_runs_but_the_ring_merges_in_float32(backends):
    """Measured behaviour, not a planted bug: torch's merger upcasts to float32 (convert_to_f32), which for float64
    inputs is a downcast, so a float64 ring output carries float32 rounding. The oracle sees it; the non-CP run of
    the same op does not (it is float64 throughout), which is what the second signal reports."""
    case = Case(sq=16, skv=16, h=2, causal=True, dtype="float64", seed=4)
    backend = backends["allgather"]
    verdict = run_and_grade(backend, case)
    assert verdict.status == V.FAIL and verdict.diagnosis == V.TOLERANCE, verdict.label
    assert 1e-9 < abs(verdict.worst.got - verdict.worst.expected) < 1e-5  # float32 rounding, not a wrong result
    assert not backend.last_agreement.agree and "DISAGREE" in verdict.checks[-1]


def test_registry_names_and_refusals():
    assert {"ring-allgather", "ring-alltoall"} <= set(BACKENDS)
    backend = BACKENDS["ring-alltoall"]("cpu")
    assert backend.available() is None
    assert "Load balancing requires" in backend.unsupported(Case(sq=8, skv=8, spelling="head_tail"))
    assert "multiples of 4" in backend.unsupported(Case(sq=6, skv=6, causal=True))
    assert "window" in backend.unsupported(Case(sq=8, skv=8, window=(2, 2)))
    assert backend.spellings(Case(causal=True)) == ("", "head_tail", "contiguous")
    backend.close()  # never started: nothing to stop


@dataclass(frozen=True)
class PaddedLseRing(RingEngine):
    """torch's ring on the CPU flash op whose LSE is padded to a multiple of 32 rows, as CUDA's memory-efficient op
    returns it (ceil(s / 32) * 32; the padding rows hold garbage): the GPU's fp32 ring path, reproduced on gloo."""

    def sdpa(self, device: torch.device, dtype: torch.dtype) -> SdpaOps:
        base = sdpa_ops(device, dtype)

        def fwd(q, k, v, **kwargs):
            out, lse, *rest = base.fwd(q, k, v, **kwargs)
            pad = -(-lse.shape[-1] // LSE_ALIGN) * LSE_ALIGN - lse.shape[-1]
            return (out, torch.cat([lse, lse.new_full((*lse.shape[:-1], pad), 7.0)], dim=-1), *rest)

        return SdpaOps(base.name, fwd, base.bwd, base.grad_out_name, LSE_ALIGN)


@pytest.mark.parametrize("case, broken", [
    (Case(sq=2, skv=2, seed=21), "returned 32 query rows for a shard of 1"),       # 1 row broadcast to 32
    (Case(sq=4, skv=4, seed=22), "must match the size"),                          # 2 rows against 32: raises
    (Case(sq=64, skv=64, causal=True, seed=23), "must match the size"),           # load-balanced: 16-row halves
    (Case(sq=64, skv=64, h=2, seed=24), None),                                    # 32 rows per rank
    (Case(sq=128, skv=128, causal=True, seed=25), None),                          # 64 rows, 32-row halves
])
def test_torch_ring_merge_keeps_a_padded_lse_and_the_adapter_names_it(pool, case, broken):
    """The GPU's fp32 ring crashes (.gpu-findings/cp ring-* CRASH) came from the op's LSE padding, not from the
    adapter's sharding: with the padding alone added to the CPU op, torch's ring fails exactly where
    ring_lse_padding_defect says and passes the oracle everywhere else (what cp_cases draws on CUDA)."""
    engine = PaddedLseRing("allgather")
    assert ring_lse_padding_defect(case, 2, LSE_ALIGN) == (broken is not None)
    verdict = run_and_grade(CPBackend(engine, "cpu", pool=pool), case)
    if broken is None:
        assert verdict.status == V.PASS, verdict.message
    else:
        assert verdict.status == V.CRASH and RING_LSE_PADDING in verdict.message and broken in verdict.message, \
            verdict.message
        plain = run_and_grade(CPBackend(RingEngine("allgather"), "cpu", pool=pool), case)
        assert plain.status == V.PASS, plain.message  # the same case without the padding: the control
