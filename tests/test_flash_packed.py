"""FA2's packed entry points (flash_attn_{,varlen_}{kv,qkv}packed_func) against the fake flash-attn on CPU: where
they are spellings, that a kernel misreading the stacked tensor is caught, and that the repro script makes the same
call as the adapter."""

from __future__ import annotations

import json

import pytest

from attnfuzz.backends.flash.fa2 import FlashAttn2
from attnfuzz.backends.flash.fa3 import FlashAttn3
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.fakes import flash_attn as fakes
from tests.test_backend_flash_attn import BF16, installed
from tests.test_repro_scripts import assert_standalone_and_able_to_fail, comparable, write


@pytest.fixture
def calls():
    return []


def test_fa2s_packed_entry_points_are_spellings_where_the_api_takes_them(monkeypatch, calls):
    """kvpacked for every case FA2 takes; qkvpacked only with one length and one head count for q, k and v."""
    fa2 = installed(monkeypatch, calls, "fa2")
    gqa = Case(sq=6, skv=6, h=4, hk=2, causal=True, **BF16)
    assert "kvpacked" in fa2.spellings(gqa) and "causal+window+kvpacked" in fa2.spellings(gqa)
    assert not any("qkvpacked" in s for s in fa2.spellings(gqa))
    assert not any("qkvpacked" in s for s in fa2.spellings(Case(sq=6, skv=9, **BF16)))
    assert "qkvpacked" in fa2.spellings(Case(sq=6, skv=6, **BF16))
    assert not any("packed" in s for s in FlashAttn3("cpu").spellings(gqa))   # FA3 has no such entry points here


@pytest.mark.parametrize("spelling", ["kvpacked", "qkvpacked"])
def test_a_packed_entry_point_that_reads_v_from_ks_slot_is_caught(monkeypatch, calls, spelling):
    """Negative control: the same case passes through the correct fake's packed call and fails through the one that
    reads v from k's slot of the stacked tensor; the unpacked call of the buggy fake still passes."""
    case = Case(b=2, sq=5, skv=5, h=2, hk=2, causal=True, spelling=spelling, **BF16)
    t = materialize(case)
    assert grade(case, t, installed(monkeypatch, calls, "fa2").run(case, t)).status == V.PASS
    buggy = installed(monkeypatch, calls, "fa2", packed_bug="v_from_k")
    assert grade(case, t, buggy.run(case, t)).status == V.FAIL
    plain = case.replace(spelling="")
    assert grade(plain, t, buggy.run(plain, t)).status == V.PASS


PACKED_CASES = [
    Case(b=2, sq=8, skv=11, h=4, hk=2, seqlens_q=(3, 8), seqlens_kv=(11, 5), causal=True, alignment="bottom_right",
         dtype="bfloat16", spelling="causal+window+kvpacked"),                        # varlen, GQA
    Case(b=2, sq=7, skv=7, h=2, hk=2, window=(2, 1), dtype="float16", spelling="qkvpacked", grads=True),   # batched
    Case(b=2, sq=9, skv=9, h=2, hk=2, layout="thd", seqlens_q=(9, 4), seqlens_kv=(9, 4), causal=True,
         dtype="bfloat16", spelling="qkvpacked"),                                      # varlen, one cu_seqlens
]


@pytest.mark.parametrize("case", PACKED_CASES, ids=lambda c: f"{c.layout}-{c.spelling}")
def test_fa2_packed_script_makes_the_adapters_call(tmp_path, monkeypatch, case):
    """FA2's packed entry points: the script stacks k / v (and q) as the adapter does and calls the same function."""
    calls: list = []
    fakes.install(monkeypatch, fakes.make_fa2(calls))
    assert FlashAttn2("cpu").unsupported(case) is None, FlashAttn2("cpu").unsupported(case)
    FlashAttn2("cpu").run(case, materialize(case))
    assert calls[0]["fn"] == ("flash_attn_varlen_" if case.padded or case.layout == "thd" else "flash_attn_") + \
        case.spelling.split("+")[-1] + "_func"
    script_calls = assert_standalone_and_able_to_fail(write(tmp_path, "fa2", case), fake="fa2")
    assert [json.loads(comparable(c)) for c in calls] == script_calls
