"""Negative controls for context parallelism: broken CP engines the grader and the pool must catch.

- a hand-written all-gather CP wrapper whose merge drops one rank's partial result, or merges the LSE wrongly, is
  graded FAIL with a diagnosis, while the same wrapper unbroken passes (so the grader does not fail everything);
- an engine returning zeros on every rank (the seed-000 situation) is ALL_ZERO although its CP and non-CP runs
  agree exactly: the CP-vs-non-CP comparison alone would have passed it;
- a rank that raises is reported (CRASH, with its traceback) and the pool serves the next case;
- a rank that hangs is timed out (HANG, case saved) and the pool restarts and serves the next case.

The engines live in this module; the spawned ranks import it by name to unpickle them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest
import torch

from attnfuzz.backends.cp.adapter import CPBackend
from attnfuzz.backends.cp.engine import CPEngine, LocalInputs, RankContext, RankOutput
from attnfuzz.engine.harness import run_case as run_and_grade  # derandomized tests seed from their source: keep its name
from attnfuzz.backends.cp.pool import CPPool
from attnfuzz.backends.cp.ring import RingEngine
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

FLAWS = ("", "drop_rank", "lse_max", "equal_weights")


@dataclass(frozen=True)
class GatherMergeEngine(CPEngine):
    """CP by hand: contiguous shards, all-gather K/V, one SDPA call per source rank, merge the partial results by
    their LSEs. `flaw` plants one mistake in the merge: drop_rank skips the partial from the next rank; lse_max
    returns max(lse_j) as the LSE (out stays right); equal_weights averages the partial outputs."""

    flaw: str = ""
    world: int = 2

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"gather-merge-{self.flaw or 'correct'}"

    def convention(self, case: Case) -> str:
        return "contiguous"

    def run_rank(self, ctx: RankContext, case: Case, local: LocalInputs) -> RankOutput:
        import torch.distributed as dist

        q = local.q.transpose(1, 2)
        k, v = (x.transpose(1, 2).contiguous() for x in (local.k, local.v))
        ks, vs = [torch.empty_like(k) for _ in range(ctx.world)], [torch.empty_like(v) for _ in range(ctx.world)]
        dist.all_gather(ks, k)
        dist.all_gather(vs, v)
        outs, lses = [], []
        for j in range(ctx.world):
            if (case.causal and j > ctx.rank) or (self.flaw == "drop_rank" and j == (ctx.rank + 1) % ctx.world):
                continue
            o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, ks[j], vs[j], 0.0, case.causal and j == ctx.rank, scale=case.softmax_scale)
            outs.append(o.float())
            lses.append(lse)
        lse_all = torch.stack(lses)                                       # [n, b, h, s]
        total = torch.logsumexp(lse_all, dim=0)
        weights = torch.exp(lse_all - total)[..., None]
        if self.flaw == "equal_weights":
            weights = torch.full_like(weights, 1.0 / len(outs))
        out = (weights * torch.stack(outs)).sum(0)
        lse = lse_all.max(0).values if self.flaw == "lse_max" else total
        return RankOutput(out=out.to(q.dtype).transpose(1, 2), lse=lse, ran=self.name)


@dataclass(frozen=True)
class ZeroEngine(CPEngine):
    """Every rank returns zeros and an all -inf LSE, CP or not: wrong, and consistent with itself."""

    world: int = 2
    name = "zeros"

    def convention(self, case: Case) -> str:
        return "head_tail"

    def run_rank(self, ctx, case, local) -> RankOutput:
        return RankOutput(out=local.q.new_zeros(*local.q.shape[:3], case.d_v),
                          lse=torch.full((case.b, case.h, local.q.shape[1]), float("-inf")), ran="zeros")

    def run_whole(self, ctx, case, tensors) -> RankOutput:
        return RankOutput(out=tensors.q.new_zeros(case.b, case.sq, case.h, case.d_v), ran="zeros without CP")


@dataclass(frozen=True)
class MisbehavingEngine(CPEngine):
    """Rank `bad_rank` raises (or sleeps for an hour); the others enter an all-reduce that rank never joins."""

    how: str = "raise"
    bad_rank: int = 1
    world: int = 2
    name = "misbehaving"

    def convention(self, case: Case) -> str:
        return "contiguous"

    def run_rank(self, ctx, case, local) -> RankOutput:
        import torch.distributed as dist

        if self.bad_rank in (ctx.rank, -1):
            if self.how == "hang":
                time.sleep(3600)
            raise ValueError(f"planted failure on rank {ctx.rank}")
        dist.all_reduce(torch.ones(1))
        return RankOutput(out=local.q.new_zeros(*local.q.shape[:3], case.d_v))


@dataclass(frozen=True)
class NoWholeRing(RingEngine):
    """torch's ring, whose non-CP run (the second signal) raises."""

    def run_whole(self, ctx, case, tensors) -> RankOutput:
        raise RuntimeError("planted failure of the non-CP run")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with CPPool(2, timeout_s=30, grace_s=1.0, hang_dir=tmp_path_factory.mktemp("hangs")) as p:
        yield p


CASES = [Case(sq=8, skv=8, h=2, causal=False, seed=11), Case(sq=8, skv=8, h=4, hk=2, causal=True, seed=12)]
CONTROL = Case(sq=8, skv=8, h=2, causal=True, seed=13)


@pytest.mark.parametrize("case", CASES, ids=["full", "causal-gqa"])
@pytest.mark.parametrize("flaw, expected", [("", V.PASS), ("drop_rank", V.TOLERANCE), ("lse_max", V.LSE),
                                             ("equal_weights", V.TOLERANCE)])
def test_broken_merge_is_graded_fail_with_a_diagnosis(pool, case, flaw, expected):
    verdict = run_and_grade(CPBackend(GatherMergeEngine(flaw), pool=pool), case)
    if expected == V.PASS:
        assert verdict.status == V.PASS, verdict.message
    else:
        assert (verdict.status, verdict.diagnosis) == (V.FAIL, expected), verdict.label + " " + verdict.message


def test_all_zero_backend_is_caught_although_cp_and_nocp_agree(pool):
    backend = CPBackend(ZeroEngine(), pool=pool)
    verdict = run_and_grade(backend, CONTROL)
    assert (verdict.status, verdict.diagnosis) == (V.FAIL, V.ALL_ZERO), verdict.label
    assert backend.last_agreement.agree and backend.last_agreement.max_abs_diff == 0.0  # the TE-suite check passes
    assert "agree" in verdict.checks[-1]


def test_a_raising_rank_is_reported_and_the_pool_serves_the_next_case(pool):
    restarts = pool.restarts
    verdict = run_and_grade(CPBackend(MisbehavingEngine("raise"), pool=pool), CONTROL)
    assert verdict.status == V.CRASH
    assert "planted failure on rank 1" in verdict.message and "rank(s) [1] raised" in verdict.message
    # what each rank raised comes first, so the 300-character head a case log keeps still says it
    assert "rank 1: ValueError: planted failure on rank 1" in verdict.message[:300], verdict.message
    assert pool.restarts == restarts + 1  # rank 0 was left in the all-reduce
    everyone = run_and_grade(CPBackend(MisbehavingEngine("raise", bad_rank=-1), pool=pool), CONTROL)
    assert everyone.status == V.CRASH and pool.restarts == restarts + 1  # all ranks answered: no restart needed
    assert run_and_grade(CPBackend(RingEngine("allgather"), pool=pool), CONTROL).status == V.PASS


def test_a_hanging_rank_times_out_and_the_pool_restarts(pool):
    restarts = pool.restarts
    backend = CPBackend(MisbehavingEngine("hang"), pool=pool)
    pool.timeout_s, old = 3.0, pool.timeout_s
    try:
        start = time.perf_counter()
        verdict = run_and_grade(backend, CONTROL)
        waited = time.perf_counter() - start
    finally:
        pool.timeout_s = old
    assert verdict.status == V.HANG, verdict.label + " " + verdict.message
    assert pool.restarts == restarts + 1 and waited < 60
    saved = sorted(pool.hang_dir.glob("misbehaving-*.json"))
    assert saved and json.loads(saved[0].read_text())["case"] == CONTROL.to_dict()
    assert str(saved[0]) in verdict.message
    assert run_and_grade(CPBackend(RingEngine("alltoall"), pool=pool), CONTROL).status == V.PASS


def test_a_rank_killed_between_cases_is_replaced(pool):
    pool.start()
    restarts = pool.restarts
    pool._procs[1].kill()
    pool._procs[1].join(timeout=10)
    assert run_and_grade(CPBackend(RingEngine("allgather"), pool=pool), CONTROL).status == V.PASS
    assert pool.restarts == restarts + 1


def test_a_failing_non_cp_run_leaves_the_graded_case_alone(pool):
    backend = CPBackend(NoWholeRing("allgather"), pool=pool)
    verdict = run_and_grade(backend, CONTROL)
    assert verdict.status == V.PASS, verdict.message
    assert backend.last_agreement is None and backend.last_nocp is None


def test_a_pool_never_closed_leaves_no_rendezvous_directory_behind(tmp_path):
    """A pool dropped without close() (a backend's pool lives until the process ends) still kills its ranks and
    removes its rendezvous directory: a CI machine kept hundreds of them in /tmp."""
    import gc
    import os
    pool = CPPool(2, timeout_s=30, hang_dir=tmp_path / "hangs").start()
    directory, procs = pool._init_dir, list(pool._procs)
    assert os.path.isdir(directory)
    del pool
    gc.collect()
    assert not os.path.exists(directory) and not any(p.is_alive() for p in procs)
