"""Paged KV caches: the case fields, the pool and block table built from the logical k / v, the strategy's paged
draws, and the bring-your-own-kernel contract on paged cases: planted serving bugs (a read one slot past the last
key, split-KV partials merged without rescaling) are found and shrunk on the CPU, a correct split-KV kernel is clean
over the same runs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from attnfuzz.backends import get
from attnfuzz.engine.harness import cases_for, fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.paged import GARBAGE_K, GARBAGE_V, logical_kv, owned_slots, paged_kv
from attnfuzz.strategies.space import Space, narrow_to

RAGGED = Case(b=3, sq=2, skv=21, h=4, hk=2, d_qk=8, d_v=16, seqlens_kv=(21, 7, 0), page_size=4, seed=5,
              alignment="bottom_right")
SHARED = Case(b=3, sq=1, skv=20, hk=2, h=2, seqlens_kv=(20, 9, 3), page_size=4, shared_prefix_pages=2, seed=9)


# -- the case fields ----------------------------------------------------------------------------------------------
def test_paged_fields_round_trip_and_are_left_out_at_their_default():
    assert "page_size" not in Case().to_dict() and "shared_prefix_pages" not in Case().to_dict()
    for case in (RAGGED, SHARED):
        assert Case.from_json(case.to_json()) == case


@pytest.mark.parametrize("fields, named", [
    (dict(page_size=0), "page_size"),
    (dict(page_size=True), "page_size"),
    (dict(shared_prefix_pages=1), "shared_prefix_pages"),                     # no page_size
    (dict(page_size=8, skv=12, shared_prefix_pages=2), "shared_prefix_pages"),  # 16 shared keys > skv
    (dict(page_size=8, grads=True), "grads"),
])
def test_bad_paged_fields_are_named(fields, named):
    with pytest.raises(ValueError, match=f"invalid {named}="):
        Case(**fields)


# -- the pool and the block table ---------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [RAGGED, SHARED, RAGGED.replace(page_size=1), RAGGED.replace(page_size=64),
                                  RAGGED.replace(memory="transposed"), SHARED.replace(memory="expanded_kv", h=4)])
def test_the_logical_view_through_the_table_is_the_logical_kv(case):
    t = materialize(case)
    paged = paged_kv(case, t.k, t.v)
    k, v = logical_kv(paged, case.skv)
    for n, length in enumerate(case.lens_kv):
        assert torch.equal(k[n, :length], t.k[n, :length]) and torch.equal(v[n, :length], t.v[n, :length])
    assert paged.block_table.dtype == torch.int32 and paged.cache_seqlens.tolist() == list(case.lens_kv)
    assert paged.block_table.shape == (case.b, -(-case.skv // case.page_size))


def test_every_slot_no_sequence_owns_is_garbage_and_unused_entries_name_the_garbage_page():
    for case in (RAGGED, SHARED):
        paged = paged_kv(case, *(lambda t: (t.k, t.v))(materialize(case)))
        free = ~owned_slots(paged)
        assert free.any()
        assert (paged.k_cache[free] == GARBAGE_K).all() and (paged.v_cache[free] == GARBAGE_V).all()
        assert free[paged.garbage_page].all()
        for n, used in enumerate(paged.pages):
            assert (paged.block_table[n, used:] == paged.garbage_page).all()
            assert paged.garbage_page not in paged.page_indices(n)


def test_pages_are_shuffled_from_the_seed():
    orders = {tuple(paged_kv(c, (t := materialize(c)).k, t.v).block_table.flatten().tolist())
              for c in (RAGGED.replace(seed=s) for s in range(6))}
    assert len(orders) > 1
    t = materialize(RAGGED)
    assert torch.equal(paged_kv(RAGGED, t.k, t.v).block_table, paged_kv(RAGGED, t.k, t.v).block_table)


def test_shared_prefix_pages_are_one_set_of_pool_pages():
    t = materialize(SHARED)
    paged = paged_kv(SHARED, t.k, t.v)
    first, second, third = (paged.page_indices(n) for n in range(3))
    assert first[:2] == second[:2] and third == first[:1]          # the 3-key sequence uses one page, the shared one
    assert len(set(first) | set(second) | set(third)) == len(set(first)) + len(set(second[2:]))
    assert torch.equal(t.k[1, :8], t.k[0, :8]) and torch.equal(t.v[2, :3], t.v[0, :3])
    unshared = SHARED.replace(shared_prefix_pages=0)
    assert not torch.equal(materialize(unshared).k[1, :8], materialize(unshared).k[0, :8])


# -- the strategy -------------------------------------------------------------------------------------------------
def test_paged_draws_cover_page_sizes_decode_and_shared_prefixes():
    seen = {"paged": 0, "decode": 0, "shared": 0, "ragged_tail": 0, "sizes": set()}

    @settings(max_examples=300, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=attention_cases(Space(max_len=64, paged=True, unpaged=False)))
    def check(case):
        assert case.paged and not case.grads
        seen["paged"] += 1
        seen["sizes"].add(case.page_size)
        seen["decode"] += case.sq <= 4 and case.alignment == "bottom_right"
        seen["shared"] += case.shared_prefix_pages > 0
        seen["ragged_tail"] += any(n % case.page_size for n in case.lens_kv)

    check()
    assert seen["paged"] == 300 and {1, 16} <= seen["sizes"], seen
    assert min(seen["decode"], seen["shared"], seen["ragged_tail"]) >= 5, seen


def _gradient_and_paged_shares(space: Space, n: int = 400) -> tuple[float, float]:
    seen = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=attention_cases(space))
    def collect(case):
        seen.append(case)

    collect()
    return sum(c.grads for c in seen) / len(seen), sum(c.paged for c in seen) / len(seen)


def test_a_backend_that_takes_paged_and_unpaged_cases_keeps_its_gradients():
    """A paged cache takes no gradients; where a backend takes both kinds of case, a case that drew gradients keeps
    them instead of losing them to a cache, and a cache is still drawn about as often (rich cases, paged two times in
    three, had lost most of their gradients: FA4 drew them in 8 % of its cases against 23 % for a backend without
    paged caches)."""
    plain_grads, _ = _gradient_and_paged_shares(Space(max_len=64), 1000)
    grads, paged = _gradient_and_paged_shares(Space(max_len=64, paged=True), 1000)
    assert grads >= 0.75 * plain_grads and paged >= 0.2, (grads, plain_grads, paged)


def test_paged_cases_are_drawn_only_for_backends_that_read_them():
    assert narrow_to(Space(paged=True), get("tests.paged_kernels:paged_attention").unsupported).unpaged is False
    sdpa = get("sdpa-math")
    assert not sdpa.serves_paged

    @settings(max_examples=50, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases_for(sdpa, Space(max_len=32)))
    def check(case):
        assert not case.paged

    check()


def test_a_kernel_without_the_paged_fields_is_not_given_paged_cases():
    plain = get("tests.test_custom_backend:example_attention")
    assert not plain.serves_paged
    assert "block_table" in plain.unsupported(RAGGED)


# -- the contract on paged cases: planted serving bugs found and shrunk, the correct kernel clean ----------------
SPACE = Space(max_len=40, max_heads=4, max_head_dim=32)
RUNS = profile("ci", max_examples=200)


@pytest.mark.parametrize("kernel, needs", [
    ("reads_one_past", lambda c: c.sq == 1 and c.skv <= 2 and c.page_size <= 3),
    ("merges_without_rescaling", lambda c: c.sq <= 2 and c.skv == 2 and c.page_size == 1),  # two pages to merge
])
def test_a_planted_paged_bug_is_found_and_shrunk(kernel, needs):
    tally, findings = fuzz(get(f"tests.paged_kernels:{kernel}"), space=SPACE, settings=RUNS)
    fails = [f for f in findings if f.verdict.status == "FAIL"]
    assert fails, f"{kernel}: nothing found in {tally.to_dict()}"
    cases = [c for f in fails for c in (f.case, *(c for c, v in f.attached if v.status == "FAIL"))]  # one per label
    case = min(cases, key=lambda c: (c.b, c.sq + c.skv, c.page_size))   # attached labels of one root cause included
    assert case.paged and case.b == 1 and case.h == 1 and needs(case), f"{kernel}: not shrunk far enough: {case!r}"


def test_the_correct_paged_kernel_is_clean_over_the_same_runs():
    tally, findings = fuzz(get("tests.paged_kernels:paged_attention"), space=SPACE, settings=RUNS)
    assert not findings, [f"{f.verdict.label} {f.verdict.message[:200]} {f.case!r}" for f in findings]
    assert tally.labels["PASS"] >= 150, tally.to_dict()


def test_attnfuzz_shrink_walks_a_paged_case_toward_smaller_pages():
    from attnfuzz.engine.harness import run_case
    from attnfuzz.tools.shrink import shrink
    backend = get("tests.paged_kernels:merges_without_rescaling")
    big = Case(b=2, sq=9, skv=40, h=4, hk=2, d_qk=32, d_v=32, page_size=16, shared_prefix_pages=1, seed=3)

    def fails(case):
        verdict = run_case(backend, case)
        return verdict if verdict.status == "FAIL" else None

    assert fails(big)
    small, _, _ = shrink(big, fails)
    assert small.paged and small.shared_prefix_pages == 0 and small.page_size < 16 and small.b == 1, small
    assert shrink(big, lambda case: None)[0] == big                                  # control: nothing kept
