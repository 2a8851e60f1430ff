"""flash-attn's serving paths against fakes (tests/fakes/flash_attn.py) on CPU: FA2's flash_attn_with_kvcache
(contiguous and paged caches, appending, split-KV) and FA4's paged varlen call. Argument translation, capability
rules, grading end to end, planted kernels found and shrunk, correct ones clean, and the standalone repro scripts."""

from __future__ import annotations

import json

import pytest
import torch

from attnfuzz.backends import factories
from attnfuzz.backends.flash import common as fc
from attnfuzz.backends.flash import kvcache as kc
from attnfuzz.backends.flash.fa4 import FlashAttn4
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.paged import GARBAGE_V, paged_kv
from attnfuzz.strategies.space import Space
from tests.fakes import flash_attn as fakes

BF16 = dict(dtype="bfloat16", d_qk=32, d_v=32)
PAGED = Case(b=3, sq=2, skv=600, h=4, hk=2, seqlens_kv=(600, 257, 3), page_size=256, causal=True,
             alignment="bottom_right", seed=3, **BF16)
PAGED_FA4 = Case(b=3, sq=5, skv=37, h=4, hk=2, seqlens_q=(5, 2, 1), seqlens_kv=(37, 16, 3), page_size=16, seed=4,
                 alignment="bottom_right", causal=True, **BF16)
SPACE = Space(max_len=48, max_heads=4, max_head_dim=32)


def kvcache(monkeypatch, calls, bug=None):
    fakes.install(monkeypatch, fakes.make_fa2(calls, kvcache_bug=bug))
    return kc.FlashAttnKVCache("cpu")


class FlashAttn4NoNeg(FlashAttn4):
    """FA4 without its "neg" spellings, whose (-1, 0) empty band the fake keeps (flash-attention#2490), so a fuzz run
    meets only the bug planted here."""

    def spellings(self, case: Case) -> tuple[str, ...]:
        return tuple(s for s in super().spellings(case) if "neg" not in s)


def fa4(monkeypatch, calls, bug=None):
    fakes.install(monkeypatch, fakes.make_fa4(calls, paged_bug=bug))
    return FlashAttn4NoNeg("cpu", arch=90)


def graded(backend, case):
    t = materialize(case)
    return grade(case, t, backend.run(case, t), family=backend.family)


# -- flash_attn_with_kvcache -------------------------------------------------------------------------------------
@pytest.mark.parametrize("spelling, splits, appended", [("", 0, 0), ("split", 3, 0), ("append", 0, 2),
                                                         ("window+split+append", 3, 2)])
def test_kvcache_spellings_reach_the_call(monkeypatch, spelling, splits, appended):
    calls: list = []
    backend = kvcache(monkeypatch, calls)
    case = PAGED.replace(spelling=spelling)
    assert backend.unsupported(case) is None, backend.unsupported(case)
    assert graded(backend, case).status == V.PASS
    call = calls[-1]
    assert (call["num_splits"], call["appended"], call["paged"]) == (splits, appended, True)
    assert call["cache_seqlens"] == [n - appended for n in PAGED.lens_kv]
    assert call["causal"] == (spelling != "window+split+append")


def test_kvcache_appends_only_where_the_cache_has_a_slot_per_query(monkeypatch):
    """flash_attn_with_kvcache refuses k / v when sq exceeds the cache's length (its check compares seqlen_q, though
    it speaks of the key): 63 queries over one cached key are not spelled "+append", and each spelling offered runs."""
    calls: list = []
    backend = kvcache(monkeypatch, calls)
    tall = Case(b=2, sq=63, skv=1, h=2, hk=2, d_qk=32, d_v=32, dtype="float16")
    assert not any("append" in s for s in backend.spellings(tall))
    assert any("append" in s for s in backend.spellings(tall.replace(sq=1)))
    for spelling in backend.spellings(tall):
        assert graded(backend, tall.replace(spelling=spelling)).status == V.PASS, spelling


def test_kvcache_appends_a_gqa_decode_step_only_where_the_cache_holds_the_group(monkeypatch):
    """One query of a GQA case with no window: flash_api.cpp folds the group into the query's rows before that check,
    so appending to a one-slot cache with 2 heads per KV head is refused; with a finite window (no fold: "wide"), or a
    cache as long as the group, it is offered, and every spelling offered runs."""
    backend = kvcache(monkeypatch, [])
    step = Case(sq=1, skv=1, h=2, hk=1, d_qk=8, d_v=8, dtype="float16")
    assert "append" not in backend.spellings(step) and "wide+append" in backend.spellings(step)
    assert "append" in backend.spellings(step.replace(skv=2))
    for case in (step, step.replace(skv=2), step.replace(causal=True, window=(0, None))):
        for spelling in backend.spellings(case):
            assert graded(backend, case.replace(spelling=spelling)).status == V.PASS, (case, spelling)


def test_kvcache_contiguous_cache_and_decode_with_gqa_pass(monkeypatch):
    backend = kvcache(monkeypatch, [])
    for case in (PAGED.replace(page_size=None, spelling="append"),
                 Case(b=2, sq=1, skv=9, h=4, hk=1, seqlens_kv=(9, 4), softcap=3.0, **BF16)):
        assert graded(backend, case).status == V.PASS, case


@pytest.mark.parametrize("case, reason", [
    (PAGED.replace(page_size=16), "page_block_size % 256"),
    (PAGED.replace(page_size=None, grads=True), "forward-only"),
    (PAGED.replace(seqlens_q=(2, 1, 2)), "one query length"),
    (PAGED.replace(layout="thd", seqlens_q=(2, 2, 2)), "not packed"),
    (PAGED.replace(dtype="float32"), "dtype float32"),
    (PAGED.replace(spelling="neg"), "spelling='neg'"),
    (PAGED.replace(shared_prefix_pages=1, seqlens_kv=(600, 300, 260), spelling="append"), "spelling='append'"),
])
def test_kvcache_capability_refusals(case, reason):
    refused = kc.FlashAttnKVCache("cpu").unsupported(case)
    assert refused is not None and reason in refused, refused


@pytest.mark.parametrize("bug, spelling", [("read_past", ""), ("no_append", "append")])
def test_kvcache_planted_bugs_are_caught(monkeypatch, bug, spelling):
    """Controls: reading one slot past a cache reads garbage; attending before the appended keys drops keys."""
    case = PAGED.replace(spelling=spelling, causal=False, alignment="top_left")
    assert graded(kvcache(monkeypatch, []), case).status == V.PASS
    assert graded(kvcache(monkeypatch, [], bug), case).status == V.FAIL


def test_kvcache_fuzzing_finds_and_shrinks_a_read_past_and_a_correct_fake_is_clean(monkeypatch):
    tally, findings = fuzz(kvcache(monkeypatch, []), space=SPACE, settings=profile("ci", max_examples=80))
    assert not findings, [f"{f.verdict.label} {f.case!r}" for f in findings]
    assert tally.labels["PASS"] >= 40, tally.to_dict()
    _, findings = fuzz(kvcache(monkeypatch, [], "read_past"), space=SPACE, settings=profile("ci", max_examples=80))
    assert findings, "a kernel reading one slot past each cache was not found"
    case = findings[0].case
    assert case.b == 1 and case.sq == 1 and case.skv <= 2 and case.lens_kv[0] < case.skv or case.paged, case


# -- the pool both adapters hand over ----------------------------------------------------------------------------
@pytest.mark.parametrize("case", [PAGED, PAGED_FA4.replace(shared_prefix_pages=1, seqlens_kv=(37, 0, 20))],
                         ids=["fa2-pages", "fa4-shared-prefix-empty-cache"])
def test_the_flash_pool_is_the_cases_pool_and_appended_slots_stay_garbage(case):
    """kvcache_inputs over kvcache_arguments (what fa2-kvcache, FA4's paged route and their scripts build) gives
    strategies/paged.py's pool bit for bit; appending leaves each sequence's last keys' slots garbage, for the kernel
    to write."""
    t = materialize(case)
    want = paged_kv(case, t.k, t.v)
    got = fc.kvcache_inputs(**fc.kvcache_arguments(case, t))
    assert torch.equal(got["block_table"], want.block_table)
    assert torch.equal(got["k_cache"], want.k_cache) and torch.equal(got["v_cache"], want.v_cache)
    if case.shared_prefix_pages:  # no appending into shared pages (fa2-kvcache's spellings)
        return
    new = 2
    appended = fc.kvcache_inputs(**fc.kvcache_arguments(case, t, new))
    for n, length in enumerate(case.lens_kv):
        for j in range(length):
            page, slot = int(want.block_table[n, j // case.page_size]), j % case.page_size
            held = appended["v_cache"][page, slot]
            assert torch.equal(held, torch.full_like(held, GARBAGE_V) if j >= length - new else t.v[n, j]), (n, j)
    assert torch.equal(appended["v"], torch.stack([t.v[n, length - new:length] for n, length in
                                                   enumerate(case.lens_kv)]))


# -- FA4's paged path ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spelling, route", [("", fc.PAGED_PACKED), ("seqused", fc.PAGED)])
def test_fa4_paged_cases_pass_through_page_table_and_seqused_k(monkeypatch, spelling, route):
    calls: list = []
    backend = fa4(monkeypatch, calls)
    case = PAGED_FA4.replace(spelling=spelling, shared_prefix_pages=1, seqlens_kv=(37, 16, 20))
    assert backend.serves_paged and backend.route(case) == route
    assert graded(backend, case).status == V.PASS
    assert calls[-1]["paged"] and calls[-1]["seqused_k"] == [37, 16, 20]


@pytest.mark.parametrize("bug", ["read_past", "consecutive"])
def test_fa4_paged_planted_bugs_are_caught(monkeypatch, bug):
    case = PAGED_FA4.replace(causal=False, alignment="top_left")
    assert graded(fa4(monkeypatch, []), case).status == V.PASS
    assert graded(fa4(monkeypatch, [], bug), case).status == V.FAIL


def test_fa4_fuzzing_draws_paged_cases_and_finds_a_page_order_bug(monkeypatch):
    space = SPACE.replace(compiled_share=0.0)   # a fake compiles nothing: every case drawn fresh
    tally, findings = fuzz(fa4(monkeypatch, []), space=space, settings=profile("ci", max_examples=90))
    assert not findings, [f"{f.verdict.label} {f.case!r}" for f in findings]
    assert tally.labels["PASS"] >= 40, tally.to_dict()
    _, findings = fuzz(fa4(monkeypatch, [], "consecutive"), space=space, settings=profile("ci", max_examples=120))
    assert findings and all(f.case.paged for f in findings), findings
    case = findings[0].case
    assert case.b <= 2 and case.sq == 1 and case.skv <= 2 * case.page_size, case   # shrunk: two pages at most


# -- standalone repro scripts -------------------------------------------------------------------------------------
SMALL = PAGED.replace(skv=9, seqlens_kv=(9, 4, 5), d_qk=8, d_v=8)   # small enough for the script to inline it
REPRO = {"fa2-kvcache": (SMALL.replace(spelling="causal+window+split+append"), "fa2"),
         "fa2-kvcache-contiguous": (SMALL.replace(page_size=None, spelling="append"), "fa2"),
         "fa4": (PAGED_FA4.replace(shared_prefix_pages=1, seqlens_kv=(37, 16, 20)), "fa4"),
         "fa4-seqused": (PAGED_FA4.replace(spelling="seqused"), "fa4")}


@pytest.mark.parametrize("name", sorted(REPRO))
def test_repro_scripts_make_the_adapters_call_and_can_fail(tmp_path, monkeypatch, name):
    from tests.test_repro_scripts import assert_standalone_and_able_to_fail, comparable, write
    case, fake = REPRO[name]
    calls: list = []
    backend = kvcache(monkeypatch, calls) if fake == "fa2" else fa4(monkeypatch, calls)
    assert backend.unsupported(case) is None, backend.unsupported(case)
    backend.run(case, materialize(case))
    registered = name.split("-contiguous")[0].split("-seqused")[0]
    assert registered in factories()
    script_calls = assert_standalone_and_able_to_fail(write(tmp_path, registered, case), fake=fake)
    assert [json.loads(comparable(c)) for c in calls] == script_calls
