"""The FA2 / FA3 / FA4 adapters against fake flash-attn modules (tests/fakes/flash_attn.py) on CPU: argument
translation per spelling, end-to-end grading, the capability tables, and the FA4 (-1, 0) empty-band finding."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

from attnfuzz.backends import factories
from attnfuzz.backends.flash import common as fc
from attnfuzz.backends.base import Unsupported
from attnfuzz.backends.flash.fa2 import FlashAttn2
from attnfuzz.backends.flash.fa3 import FlashAttn3
from attnfuzz.backends.flash.fa4 import KNOBS, FlashAttn4
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.fakes import flash_attn as fakes

ADAPTERS = {"fa2": (FlashAttn2, fakes.make_fa2), "fa3": (FlashAttn3, fakes.make_fa3),
            "fa4": (FlashAttn4, fakes.make_fa4)}
BF16 = dict(dtype="bfloat16")


@pytest.fixture
def calls():
    return []


def installed(monkeypatch, calls, name, **fake_kwargs):
    cls, make = ADAPTERS[name]
    fakes.install(monkeypatch, make(calls, **fake_kwargs))
    return cls("cpu")


# -- (a) argument translation ------------------------------------------------------------------------------------
CAUSAL_BR = Case(sq=6, skv=9, causal=True, alignment="bottom_right", **BF16)
TRANSLATIONS = [  # (backend, case, spelling, expected causal, expected window)
    ("fa2", CAUSAL_BR, "", True, (-1, -1)),
    ("fa2", CAUSAL_BR, "window", False, (-1, 0)),
    ("fa2", CAUSAL_BR, "causal+window", True, (-1, 0)),
    ("fa2", CAUSAL_BR, "wide", False, (9, 0)),
    ("fa3", CAUSAL_BR, "", True, (-1, -1)),
    ("fa3", CAUSAL_BR, "window", False, (-1, 0)),
    ("fa4", CAUSAL_BR, "", True, (None, None)),
    ("fa4", CAUSAL_BR, "window", False, (None, 0)),
    ("fa4", CAUSAL_BR, "causal+window", True, (None, 0)),
    ("fa4", CAUSAL_BR, "wide", False, (9, 0)),
    ("fa4", CAUSAL_BR, "neg", False, (-1, 0)),
    ("fa4", CAUSAL_BR, "causal+neg", True, (-1, 0)),
    ("fa2", Case(sq=6, skv=9, window=(2, 3), alignment="bottom_right", **BF16), "", False, (2, 3)),
    ("fa4", Case(sq=6, skv=9, window=(2, None), alignment="bottom_right", **BF16), "", False, (2, None)),
    ("fa4", Case(sq=6, skv=9, window=(2, None), alignment="bottom_right", **BF16), "neg", False, (2, -1)),
    ("fa2", Case(sq=6, skv=9, window=(2, None), alignment="bottom_right", **BF16), "", False, (2, -1)),
    ("fa2", Case(sq=8, skv=8, causal=True, window=(3, None), **BF16), "", True, (3, -1)),
    ("fa4", Case(sq=8, skv=8, causal=True, window=(3, None), **BF16), "window", False, (3, 0)),
    # top-left bands are bottom-right bands shifted by skv - sq: left + d, right - d
    ("fa2", Case(sq=9, skv=6, causal=True, **BF16), "", False, (-1, 3)),
    ("fa4", Case(sq=5, skv=9, window=(1, 6), **BF16), "", False, (5, 2)),
    ("fa2", Case(sq=4, skv=4, **BF16), "", False, (-1, -1)),
    ("fa4", Case(sq=4, skv=4, **BF16), "wide", False, (4, 4)),
]


@pytest.mark.parametrize("name,case,spelling,causal,window", TRANSLATIONS)
def test_mask_translation(monkeypatch, calls, name, case, spelling, causal, window):
    backend = installed(monkeypatch, calls, name)
    case = case.replace(spelling=spelling)
    assert backend.unsupported(case) is None
    out = backend.run(case, materialize(case))
    assert (calls[-1]["causal"], calls[-1]["window_size"]) == (causal, window)
    assert f"causal={causal}" in out.ran


def test_features_reach_the_call(monkeypatch, calls):
    fa4 = installed(monkeypatch, calls, "fa4")
    case = Case(sq=5, skv=7, h=4, softcap=3.0, scale=0.4, softmax="learnable", **BF16)
    t = materialize(case)
    fa4.run(case, t)
    got = calls[-1]
    assert (got["softcap"], got["softmax_scale"]) == (3.0, 0.4)
    assert torch.equal(got["learnable_sink"], t.sink)
    fa2 = installed(monkeypatch, calls, "fa2")
    case = Case(sq=5, skv=7, h=2, alibi_slopes=(0.5, 0.25), alignment="bottom_right", **BF16)
    t = materialize(case)
    fa2.run(case, t)
    assert torch.equal(calls[-1]["alibi_slopes"], t.alibi) and calls[-1]["softmax_scale"] is None


def test_varlen_and_padding_routes(monkeypatch, calls):
    case = Case(b=3, sq=7, skv=9, seqlens_q=(7, 0, 3), seqlens_kv=(2, 9, 4), alignment="bottom_right", causal=True,
                **BF16)
    for name in ("fa2", "fa3", "fa4"):
        backend = installed(monkeypatch, calls, name)
        backend.run(case, materialize(case))
        assert calls[-1]["fn"] == "flash_attn_varlen_func" and calls[-1]["cu_seqlens_q"] == [0, 7, 7, 10]
    fa4 = installed(monkeypatch, calls, "fa4")
    assert "seqused+causal+neg" in fa4.spellings(case)
    seqused = case.replace(spelling="seqused")
    fa4.run(seqused, materialize(seqused))
    assert (calls[-1]["seqused_q"], calls[-1]["seqused_k"], calls[-1]["shape"]) == ([7, 0, 3], [2, 9, 4],
                                                                                    (3, 7, 1, 16))
    thd = Case(b=2, sq=6, skv=6, seqlens_q=(6, 2), seqlens_kv=(6, 2), layout="thd", **BF16)
    assert not any(s.startswith("seqused") for s in fa4.spellings(thd))


# -- (b) end to end through grade() ------------------------------------------------------------------------------
FEATURE_CASES = [
    Case(b=2, sq=12, skv=12, h=4, hk=2, causal=True, grads=True, **BF16),
    Case(sq=7, skv=13, causal=True, alignment="bottom_right", dtype="float16", grads=True),
    Case(sq=13, skv=7, causal=True, alignment="bottom_right", **BF16),       # rows with no key: out 0
    Case(sq=10, skv=7, window=(3, 2), h=2, alignment="top_left", layout="sbhd", grads=True, **BF16),
    Case(b=3, sq=9, skv=11, seqlens_q=(9, 1, 4), seqlens_kv=(11, 0, 6), layout="thd", causal=True,
         alignment="bottom_right", grads=True, **BF16),
    Case(b=2, sq=8, skv=8, seqlens_q=(8, 3), seqlens_kv=(5, 8), causal=True, window=(2, None),
         alignment="bottom_right", memory="transposed", **BF16),
    Case(sq=9, skv=9, h=4, hk=2, memory="expanded_kv", softcap=2.0, scale=0.7, grads=True, dtype="float16"),
]
FA4_ONLY = [Case(sq=8, skv=11, h=2, softmax="learnable", causal=True, alignment="bottom_right", grads=True, **BF16),
            Case(sq=8, skv=8, h=2, softmax="off_by_one", window=(2, 1), d_qk=16, d_v=24, **BF16)]
FA2_ONLY = [Case(sq=6, skv=10, h=2, alibi_slopes=(0.5, 0.125), alignment="bottom_right", causal=True, grads=True,
                 **BF16)]


@pytest.mark.parametrize("name,cases", [("fa2", FEATURE_CASES + FA2_ONLY), ("fa3", FEATURE_CASES),
                                        ("fa4", FEATURE_CASES + FA4_ONLY)])
def test_every_safe_spelling_passes_grading(monkeypatch, calls, name, cases):
    backend = installed(monkeypatch, calls, name)
    graded = 0
    for case in cases:
        assert backend.unsupported(case) is None, (case, backend.unsupported(case))
        for spelling in backend.spellings(case):
            if "neg" in spelling:
                continue  # FA4's -1 sentinel: graded on its own below, it is the seed-003 finding
            spelled = case.replace(spelling=spelling)
            t = materialize(spelled)
            out = backend.run(spelled, t)
            verdict = grade(spelled, t, out, family=backend.family)
            assert verdict.status == V.PASS, (spelled, verdict.message)
            assert (out.lse is not None) == (spelling != "no_lse") and (out.dq is not None) == case.grads
            graded += 1
    assert graded >= len(cases)


def test_grading_through_a_fake_can_fail(monkeypatch, calls):
    """Negative control: a fake FA2 whose causal mask is top-left is caught as MASK_ALIGNMENT."""
    modules = fakes.make_fa2(calls)
    iface = modules["flash_attn.flash_attn_interface"]

    def top_left_causal(q, k, v, softmax_scale=None, return_attn_probs=False, **kw):
        shift = k.shape[1] - q.shape[1]          # the bottom-right diagonal pulled back to the top-left corner
        out, lse = fakes.run_band(q, k, v, left=None, right=-shift, scale=softmax_scale, softcap=0.0)
        return (out, lse, None) if return_attn_probs else out

    iface.flash_attn_func = top_left_causal
    fakes.install(monkeypatch, modules)
    case = Case(sq=6, skv=10, causal=True, alignment="bottom_right", **BF16)
    t = materialize(case)
    verdict = grade(case, t, FlashAttn2("cpu").run(case, t))
    assert (verdict.status, verdict.diagnosis) == (V.FAIL, V.MASK_ALIGNMENT)


# -- (c) capability rules ----------------------------------------------------------------------------------------
REFUSALS = [
    ("fa2", Case(dtype="float32"), "dtype float32"),
    ("fa2", Case(d_qk=16, d_v=32, **BF16), "d_qk=16 != d_v=32"),
    ("fa2", Case(mask_density=0.5, **BF16), "explicit boolean mask"),
    ("fa2", Case(softmax="off_by_one", **BF16), "no attention sink"),
    ("fa2", Case(sq=4, skv=9, causal=True, **BF16), "no negative bounds"),
    ("fa2", Case(b=2, sq=9, skv=9, seqlens_q=(9, 3), seqlens_kv=(9, 9), window=(2, 2), **BF16),
     "per-sequence skv - sq"),
    ("fa2", Case(sq=4, skv=9, h=1, alibi_slopes=(0.5,), **BF16), "top-left ALiBi"),
    ("fa2", Case(d_qk=264, d_v=264, **BF16), "> 256"),
    ("fa3", Case(d_qk=20, d_v=20, **BF16), "multiples of 8"),
    ("fa3", Case(d_qk=128, d_v=64, **BF16), "d_v != d_qk only"),
    ("fa3", Case(h=1, alibi_slopes=(0.5,), **BF16), "ALiBi"),
    ("fa4", Case(h=1, alibi_slopes=(0.5,), **BF16), "ALiBi"),
    ("fa4", Case(d_qk=264, d_v=264, **BF16), "8..256"),
    ("fa4", Case(mask_density=0.3, **BF16), "mask_mod"),
    ("fa2", Case(spelling="neg", **BF16), "not one of fa2's spellings"),
    # first H200 run: FlashAttentionBackwardSm90 asserts this, and the backward was recorded as a CRASH
    ("fa4", Case(sq=1, skv=1, h=2, hk=1, d_qk=8, d_v=16, grads=True, dtype="float16"),
     "GQA backward requires head_dim == head_dim_v"),
]


@pytest.mark.parametrize("name,case,reason", REFUSALS)
def test_capability_refusals(monkeypatch, calls, name, case, reason):
    backend = installed(monkeypatch, calls, name)
    got = backend.unsupported(case)
    assert got is not None and reason in got, got
    with pytest.raises(Unsupported, match=reason.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        backend.run(case, materialize(case))
    assert calls == []


def test_fa4_head_dims_depend_on_the_architecture():
    hd192 = Case(d_qk=192, d_v=192, **BF16)
    assert FlashAttn4("cpu", arch=90).unsupported(hd192) is None
    assert "sm100" in FlashAttn4("cpu", arch=100).unsupported(hd192)
    assert FlashAttn4("cpu", arch=100).unsupported(Case(d_qk=192, d_v=128, **BF16)) is None
    assert "backward needs sm90" in FlashAttn4("cpu", arch=80).unsupported(Case(grads=True, **BF16))


def test_fa4_gqa_backward_rule_is_narrow():
    """Control for the sm90 GQA-backward refusal: it needs all of gradients, GQA, d_qk != d_v and sm90."""
    refused = Case(h=4, hk=2, d_qk=16, d_v=32, grads=True, **BF16)
    assert "GQA backward" in FlashAttn4("cpu", arch=90).unsupported(refused)
    for accepted in (refused.replace(grads=False), refused.replace(hk=4), refused.replace(d_v=16)):
        assert FlashAttn4("cpu", arch=90).unsupported(accepted) is None, accepted
    assert FlashAttn4("cpu", arch=100).unsupported(refused) is None


class _BackwardRaises(torch.autograd.Function):
    """Identity forward whose backward raises `error`: a library check that fires only in the backward."""

    @staticmethod
    def forward(ctx, x, error):
        ctx.error = error
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise ctx.error


@pytest.mark.parametrize("error,expected", [
    (AssertionError("GQA backward requires head_dim == head_dim_v"), Unsupported),
    (RuntimeError("MLIRError: expected top-level shape equivalence"), RuntimeError),   # negative control
])
def test_fa4_backward_refusals_become_unsupported(monkeypatch, calls, error, expected):
    """A library assert in the backward is a refusal like one in the forward (the first H200 run recorded it as a
    CRASH because only the forward was wrapped); any other backward error stays a crash."""
    modules = fakes.make_fa4(calls)
    honest = modules["flash_attn.cute"].flash_attn_func

    def raising_backward(*args, **kwargs):
        out, lse = honest(*args, **kwargs)
        return _BackwardRaises.apply(out, error), lse

    monkeypatch.setattr(modules["flash_attn.cute"], "flash_attn_func", raising_backward)
    fakes.install(monkeypatch, modules)
    case = Case(grads=True, **BF16)
    with pytest.raises(expected, match=str(error).split(":")[0]):
        FlashAttn4("cpu").run(case, materialize(case))
    assert FlashAttn4("cpu").run(case.replace(grads=False), materialize(case)).dq is None   # forward alone runs


def test_library_refusals_become_unsupported_and_crashes_do_not(monkeypatch, calls):
    modules = fakes.make_fa4(calls)
    fakes.install(monkeypatch, modules)
    case = Case(**BF16)
    for error, expected in ((AssertionError("head_dim must be divisible by 8"), Unsupported),
                            (RuntimeError("CUDA error: an illegal memory access was encountered"), RuntimeError)):
        def broken(*args, error=error, **kwargs):
            raise error
        monkeypatch.setattr(modules["flash_attn.cute"], "flash_attn_func", broken)
        with pytest.raises(expected):
            FlashAttn4("cpu").run(case, materialize(case))


def test_availability_and_registry(monkeypatch, calls):
    for name in ("fa2", "fa3", "fa4"):
        assert name in factories()
        backend = installed(monkeypatch, calls, name)
        assert "CUDA device" in backend.available()
        assert "fake" in backend.version()
    for module in ("flash_attn", "flash_attn.flash_attn_interface", "flash_attn.cute", "flash_attn_interface"):
        monkeypatch.setitem(sys.modules, module, None)    # a None entry makes the import raise ImportError
    for name, (cls, _) in ADAPTERS.items():
        assert "not installed" in cls("cuda").available()


# -- (d) seed story 003: FA4 after #2490 reads a literal (-1, 0) as an empty band ---------------------------------
def test_fa4_negative_window_is_graded_all_zero_after_2490(monkeypatch, calls):
    backend = installed(monkeypatch, calls, "fa4", semantics="post_2490")
    case = Case(sq=16, skv=16, h=2, causal=True, **BF16)
    labels = {}
    for spelling in ("", "causal+neg", "neg", "causal+window"):
        spelled = case.replace(spelling=spelling)
        t = materialize(spelled)
        out = backend.run(spelled, t)
        labels[spelling] = grade(spelled, t, out).label
    assert labels == {"": "PASS", "causal+neg": "FAIL:ALL_ZERO", "neg": "FAIL:ALL_ZERO", "causal+window": "PASS"}
    assert calls[1]["causal"] is True and calls[1]["window_size"] == (-1, 0)


def test_fa4_before_2490_widened_the_negative_pair(monkeypatch, calls):
    """Control for the test above: the same spellings on the older semantics are causal (causal+neg) or full
    attention (neg, no causal flag), so the finding is specific to the #2490 reading."""
    backend = installed(monkeypatch, calls, "fa4", semantics="pre_2490")
    case = Case(sq=16, skv=16, h=2, causal=True, **BF16)
    labels = {}
    for spelling in ("causal+neg", "neg"):
        spelled = case.replace(spelling=spelling)
        t = materialize(spelled)
        labels[spelling] = grade(spelled, t, backend.run(spelled, t)).status
    assert labels == {"causal+neg": V.PASS, "neg": V.FAIL}


def test_fa4_negative_right_bound_is_off_by_one_after_2490(monkeypatch, calls):
    backend = installed(monkeypatch, calls, "fa4")
    case = Case(sq=12, skv=12, window=(3, None), alignment="bottom_right", spelling="neg", **BF16)
    t = materialize(case)
    verdict = grade(case, t, backend.run(case, t))
    assert verdict.status == V.FAIL, verdict
    assert calls[-1]["window_size"] == (3, -1)


def test_wide_bound_hides_no_key():
    for sq, skv in ((1, 9), (9, 1), (5, 5)):
        wide = fc.wide_bound(Case(sq=sq, skv=skv))
        for i in range(sq):
            for off in (0, skv - sq):
                assert i + off - wide <= 0 and i + off + wide >= skv - 1


def test_fa4_turns_its_disk_cache_on_before_import_unless_the_user_chose(monkeypatch, calls):
    """FA4 reads FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED once, at import: attnfuzz sets it first (every fresh worker
    would otherwise recompile each kernel), and a user's "0" stays."""
    from attnfuzz.backends.flash.fa4 import DISK_CACHE
    seen = []
    fakes.install(monkeypatch, fakes.make_fa4(calls))
    real_import = importlib.import_module
    monkeypatch.setattr(importlib, "import_module",
                        lambda name, *a: seen.append((name, os.environ.get(DISK_CACHE))) or real_import(name, *a))
    monkeypatch.delenv(DISK_CACHE, raising=False)
    FlashAttn4("cuda").available()
    assert seen[0] == ("flash_attn.cute", "1")
    monkeypatch.setenv(DISK_CACHE, "0")
    FlashAttn4("cuda").available()
    assert seen[-1] == ("flash_attn.cute", "0")


# -- FA4's kernel knobs as spellings -----------------------------------------------------------------------------
def test_fa4_knob_spellings_are_declared_where_the_interface_takes_them():
    gqa, mha = Case(h=4, hk=2, grads=True, **BF16), Case(h=2, hk=2, grads=True, **BF16)
    knobs = lambda case, arch: [s for s in FlashAttn4("cpu", arch=arch).spellings(case) if s in KNOBS]  # noqa: E731
    assert knobs(gqa, 90) == ["nopack"]                          # sm90: no SplitKV, no deterministic backward
    assert knobs(mha, 90) == ["pack"]                            # packing a group of one, not the default
    assert knobs(gqa, 100) == ["splits3", "nopack", "deterministic"]
    assert knobs(gqa.replace(grads=False), 100) == ["splits3", "nopack"]   # deterministic is the backward's
    assert "spelling='splits3'" in FlashAttn4("cpu", arch=90).unsupported(gqa.replace(spelling="splits3"))


@pytest.mark.parametrize("spelling,arch,expected", [("splits3", 100, {"num_splits": 3}),
                                                    ("nopack", 90, {"pack_gqa": False}),
                                                    ("deterministic", 100, {"deterministic": True})])
def test_fa4_knobs_reach_the_call_and_pass_grading(monkeypatch, calls, spelling, arch, expected):
    installed(monkeypatch, calls, "fa4")
    fa4 = FlashAttn4("cpu", arch=arch)
    for case in (Case(b=2, sq=9, skv=12, h=4, hk=2, causal=True, alignment="bottom_right", grads=True, **BF16),
                 Case(b=2, sq=9, skv=12, h=4, hk=2, seqlens_q=(9, 4), seqlens_kv=(12, 5), grads=True, **BF16)):
        spelled = case.replace(spelling=spelling)
        assert fa4.unsupported(spelled) is None, fa4.unsupported(spelled)
        t = materialize(spelled)
        out = fa4.run(spelled, t)
        assert {name: calls[-1][name] for name in expected} == expected, calls[-1]
        assert all(f"{name}={value}" in out.ran for name, value in expected.items()), out.ran
        assert grade(spelled, t, out, family=fa4.family).status == V.PASS


def test_a_knob_that_changes_the_answer_is_caught(monkeypatch, calls):
    """Negative control: a fake FA4 whose split-KV combine drops the last split's keys fails grading."""
    modules = fakes.make_fa4(calls)
    cute = modules["flash_attn.cute"]
    honest = cute.flash_attn_func

    def lossy_splits(q, k, v, num_splits=1, **kw):
        if num_splits > 1:
            keep = k.shape[1] - k.shape[1] // num_splits
            k, v = k[:, :keep], v[:, :keep]
        return honest(q, k, v, num_splits=num_splits, **kw)

    cute.flash_attn_func = lossy_splits
    fakes.install(monkeypatch, modules)
    fa4 = FlashAttn4("cpu", arch=100)
    case = Case(sq=6, skv=12, h=2, **BF16)
    for spelling, status in (("", V.PASS), ("splits3", V.FAIL)):
        spelled = case.replace(spelling=spelling)
        t = materialize(spelled)
        assert grade(spelled, t, fa4.run(spelled, t), family=fa4.family).status == status, spelling
