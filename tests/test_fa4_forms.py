"""FA4's argument forms (fuzz/backends/flash/fa4_forms.py and the "pack" knob) against the fake flash_attn.cute on
CPU: which cases list which form, the arguments each form passes, grading of the output alone without an LSE, a fake
that mishandles one form caught under that spelling and not under the default one, the compile key, and repro
scripts that make the adapter's call."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from attnfuzz.backends.flash.fa4 import FlashAttn4
from attnfuzz.backends.flash.fa4_forms import FORMS
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.fakes import flash_attn as fakes
from tests.test_backend_flash_attn import BF16
from tests.test_flash_paged import PAGED_FA4
from tests.test_repro_scripts import assert_standalone_and_able_to_fail, comparable, write

CAUSAL = Case(b=2, sq=7, skv=10, h=2, hk=2, causal=True, alignment="bottom_right", **BF16)
PADDED = Case(b=2, sq=8, skv=11, h=4, hk=2, seqlens_q=(3, 8), seqlens_kv=(11, 5), window=(3, 1),
              alignment="bottom_right", dtype="float16")
OFF_BY_ONE = Case(sq=6, skv=9, h=2, softmax="off_by_one", causal=True, alignment="bottom_right", **BF16)
LARGE_SINK = Case(sq=6, skv=9, h=2, softmax="learnable", values="large_sink", **BF16)


@pytest.fixture
def calls():
    return []


def fa4(monkeypatch, calls, arch=90, **fake):
    fakes.install(monkeypatch, fakes.make_fa4(calls, **fake))
    return FlashAttn4("cpu", arch=arch)


def verdict(backend, case):
    assert backend.unsupported(case) is None, backend.unsupported(case)
    t = materialize(case)
    return grade(case, t, backend.run(case, t), family=backend.family)


def test_each_form_is_listed_where_it_means_the_cases_attention():
    listed = FlashAttn4("cpu", arch=90).spellings
    assert {"explicit_scale", "softcap_none", "no_lse", "pack"} <= set(listed(CAUSAL))
    assert "sink_qdtype" not in listed(CAUSAL)                                 # no sink to cast
    assert "explicit_scale" not in listed(CAUSAL.replace(scale=0.3))           # the scale is already explicit
    assert "softcap_none" not in listed(CAUSAL.replace(softcap=5.0))           # None would drop the cap
    assert "sink_qdtype" in listed(OFF_BY_ONE) and "sink_qdtype" in listed(LARGE_SINK)
    assert "sink_qdtype" not in listed(LARGE_SINK.replace(values="gaussian"))  # randn sinks round in bf16
    assert "pack" not in listed(PADDED)                                         # GQA packs by default
    for varlen in (PADDED, PAGED_FA4, PADDED.replace(spelling="seqused")):      # flash_attn_varlen_func calls
        assert {"no_max_seqlen", "max_seqlen_tensor"} <= set(listed(varlen))
    assert not {"no_max_seqlen", "max_seqlen_tensor"} & set(listed(CAUSAL))    # flash_attn_func has no max_seqlen
    assert "spelling='pack'" in FlashAttn4("cpu", arch=90).unsupported(PADDED.replace(spelling="pack"))


FORM_CALLS = [  # (case, spelling, what the recorded call holds)
    (CAUSAL, "explicit_scale", {"softmax_scale": 1 / math.sqrt(16), "causal": True, "window_size": (None, None)}),
    (CAUSAL, "softcap_none", {"softcap": None, "softmax_scale": None}),
    (CAUSAL, "no_lse", {"return_lse": False, "softcap": 0.0}),
    (CAUSAL, "pack", {"pack_gqa": True}),
    (PADDED, "explicit_scale", {"softmax_scale": 1 / math.sqrt(16), "cu_seqlens_q": [0, 3, 11]}),
    (PADDED, "no_lse", {"return_lse": False, "fn": "flash_attn_varlen_func"}),
    (PADDED, "no_max_seqlen", {"max_seqlen_q": None, "max_seqlen_k": None, "cu_seqlens_q": [0, 3, 11]}),
]


@pytest.mark.parametrize("case, spelling, want", FORM_CALLS, ids=lambda x: x if isinstance(x, str) else "")
@pytest.mark.parametrize("grads", [False, True])
def test_each_form_passes_its_arguments_and_grades_clean(monkeypatch, calls, case, spelling, want, grads):
    backend = fa4(monkeypatch, calls)
    spelled = case.replace(spelling=spelling, grads=grads)
    assert verdict(backend, spelled).status == V.PASS
    assert {key: calls[-1][key] for key in want} == want


@pytest.mark.parametrize("case", [OFF_BY_ONE, LARGE_SINK])
def test_the_sink_form_hands_over_the_same_sinks_in_qs_dtype(monkeypatch, calls, case):
    backend = fa4(monkeypatch, calls)
    spelled = case.replace(spelling="sink_qdtype")
    t = materialize(spelled)
    out = backend.run(spelled, t)
    sink = calls[-1]["learnable_sink"]
    assert sink.dtype == torch.bfloat16 and torch.equal(sink.float(), t.sink)
    assert "learnable_sink=torch.bfloat16" in out.ran
    assert grade(spelled, t, out, family=backend.family).status == V.PASS


@pytest.mark.parametrize("case", [PADDED, PADDED.replace(grads=True), PAGED_FA4])
def test_max_seqlen_forms_reach_the_varlen_call_and_grade_clean(monkeypatch, calls, case):
    """no_max_seqlen leaves both to FA4 (None, the defaults, also where the paged call passes them); the tensor form
    hands 0-d int32 tensors holding the adapter's values."""
    backend = fa4(monkeypatch, calls)
    assert verdict(backend, case.replace(spelling="no_max_seqlen")).status == V.PASS
    assert (calls[-1]["max_seqlen_q"], calls[-1]["max_seqlen_k"]) == (None, None)
    assert verdict(backend, case.replace(spelling="max_seqlen_tensor")).status == V.PASS
    given = calls[-1]["max_seqlen_q"], calls[-1]["max_seqlen_k"]
    assert all(isinstance(x, torch.Tensor) and x.dim() == 0 and x.dtype == torch.int32 for x in given)
    assert [int(x) for x in given] == [case.sq, case.skv]
    assert verdict(backend, case).status == V.PASS
    assert (calls[-1]["max_seqlen_q"], calls[-1]["max_seqlen_k"]) == (case.sq, case.skv)


def test_without_an_lse_the_output_alone_is_graded(monkeypatch, calls):
    """no_lse hands the grader no LSE even where the library returns one (FA4 does when gradients are asked), and a
    wrong output still fails."""
    backend = fa4(monkeypatch, calls)
    for grads in (False, True):
        spelled = CAUSAL.replace(spelling="no_lse", grads=grads)
        t = materialize(spelled)
        out = backend.run(spelled, t)
        assert out.lse is None and "return_lse=False" in out.ran
        if grads:
            assert out.dq is not None
        wrong = dataclasses.replace(out, out=out.out * 0.5)
        assert grade(spelled, t, wrong, family=backend.family).status == V.FAIL


PLANTS = [  # (form bug, case, the spelling that exposes it)
    ("explicit_scale_log2", CAUSAL, "explicit_scale"),
    ("softcap_none_is_cap", CAUSAL, "softcap_none"),
    ("no_lse_drops_sink", LARGE_SINK, "no_lse"),
    ("half_sink_dropped", LARGE_SINK, "sink_qdtype"),
    ("pack_mha_head0", CAUSAL, "pack"),
    ("max_seqlen_tensor_short", PADDED, "max_seqlen_tensor"),
]


@pytest.mark.parametrize("bug, case, spelling", PLANTS, ids=[p[0] for p in PLANTS])
def test_a_fake_mishandling_one_form_is_caught_under_that_spelling_only(monkeypatch, calls, bug, case, spelling):
    """Negative control: the correct fake passes the form; the planted one fails it and still passes the default
    spelling, so the form is what finds it."""
    assert verdict(fa4(monkeypatch, calls), case.replace(spelling=spelling)).status == V.PASS
    buggy = fa4(monkeypatch, calls, form_bug=bug)
    assert verdict(buggy, case.replace(spelling=spelling)).status == V.FAIL
    assert verdict(buggy, case).status == V.PASS


def test_the_compile_key_follows_the_forms_that_change_a_kernel():
    key = FlashAttn4("cpu", arch=90).compile_key
    base, grads = CAUSAL, CAUSAL.replace(grads=True)
    assert key(base.replace(spelling="explicit_scale")) == key(base)           # the scale is a runtime value
    assert key(base.replace(spelling="no_lse")) != key(base)                   # the kernel that writes no LSE
    assert key(grads.replace(spelling="no_lse")) == key(grads)                 # gradients keep the LSE
    assert key(base.replace(spelling="softcap_none")) == key(base)             # the forward reads None as 0.0
    assert key(grads.replace(spelling="softcap_none")) != key(grads)           # the backward's softcap != 0.0
    assert key(OFF_BY_ONE.replace(spelling="sink_qdtype")) != key(OFF_BY_ONE)  # the sink's dtype
    assert key(base.replace(spelling="pack")) != key(base)                     # pack_gqa
    assert key(PADDED.replace(spelling="max_seqlen_tensor")) != key(PADDED)    # no host-side hint
    assert key(PADDED.replace(spelling="no_max_seqlen")) == key(PADDED)
    assert set(FORMS) <= set(FlashAttn4("cpu", arch=90).spellings(OFF_BY_ONE.replace(seqlens_q=(6,), seqlens_kv=(9,),
                                                                                   layout="thd")))


REPRO_CASES = [CAUSAL.replace(spelling="explicit_scale"), CAUSAL.replace(spelling="softcap_none"),
               PADDED.replace(spelling="no_lse"), LARGE_SINK.replace(spelling="sink_qdtype"),
               CAUSAL.replace(spelling="pack"), PADDED.replace(spelling="max_seqlen_tensor"),
               PAGED_FA4.replace(spelling="no_max_seqlen")]


@pytest.mark.parametrize("case", REPRO_CASES, ids=lambda c: c.spelling)
def test_the_repro_script_makes_the_spelled_call(tmp_path, monkeypatch, calls, case):
    backend = fa4(monkeypatch, calls)
    assert backend.unsupported(case) is None, backend.unsupported(case)
    backend.run(case, materialize(case))
    script_calls = assert_standalone_and_able_to_fail(write(tmp_path, "fa4", case), fake="fa4")
    assert [json.loads(comparable(c)) for c in calls] == script_calls
