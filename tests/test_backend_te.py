"""The TransformerEngine adapters (te-flash / te-fused / te-unfused) against a fake TE (tests/fakes/
transformer_engine.py) on CPU: mask-type and window translation per spelling, end-to-end grading, the capability
table, and the check that the backend asked for is the one that ran."""

from __future__ import annotations

import os

import pytest
import torch

from attnfuzz.backends import factories
from attnfuzz.backends.te import selection as sel
from attnfuzz.backends.te import adapter as te_adapter
from attnfuzz.backends.base import Unsupported
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.fakes import flash_attn as fake_fa
from tests.fakes.transformer_engine import FakeTE, fa4_passthrough

BF16 = dict(dtype="bfloat16")
NAMES = ("te-flash", "te-fused", "te-unfused")


def backend(name):
    return te_adapter.BACKENDS[name]("cpu")


@pytest.fixture
def fake(monkeypatch):
    return FakeTE().install(monkeypatch)


def run(name, case):
    t = materialize(case)
    return t, backend(name).run(case, t)


# -- (a) argument translation ------------------------------------------------------------------------------------
TRANSLATIONS = [  # (case, spelling, mask type, window, bottom_right_diagonal)
    (Case(sq=8, skv=8, causal=True), "", "causal", None, False),
    (Case(sq=8, skv=8, causal=True), "explicit-window", "causal", (-1, 0), False),
    (Case(sq=8, skv=8, causal=True), "window", "no_mask", (8, 0), False),
    (Case(sq=8, skv=8, causal=True), "wide", "causal", (8, 0), False),
    (Case(sq=6, skv=9, causal=True, alignment="bottom_right"), "", "causal_bottom_right", None, True),
    (Case(sq=6, skv=9, causal=True, alignment="bottom_right"), "window", "no_mask", (9, 0), True),
    (Case(sq=6, skv=9, causal=True, window=(2, None)), "", "causal", (2, 0), False),
    (Case(sq=6, skv=9, window=(2, 3)), "", "no_mask", (2, 3), False),
    (Case(sq=6, skv=9, window=(None, 3), alignment="bottom_right"), "", "no_mask", (9, 3), True),
    (Case(sq=6, skv=9), "", "no_mask", None, False),
    (Case(sq=6, skv=9), "wide", "no_mask", (9, 9), False),
    (Case(sq=6, skv=6), "padding", "padding", None, False),
    (Case(b=2, sq=6, skv=6, seqlens_q=(6, 2), seqlens_kv=(6, 2), causal=True, alignment="bottom_right"), "",
     "padding_causal_bottom_right", None, True),
    (Case(b=2, sq=6, skv=6, seqlens_q=(6, 2), seqlens_kv=(6, 2), layout="thd"), "", "padding", None, False),
    (Case(sq=6, skv=6, mask_density=0.5, dtype="float32"), "", "arbitrary", None, False),
    (Case(sq=6, skv=6, causal=True), "arbitrary", "arbitrary", None, False),
]


@pytest.mark.parametrize("case,spelling,mask_type,window,brd", TRANSLATIONS)
def test_mask_translation(fake, case, spelling, mask_type, window, brd):
    case = case.replace(spelling=spelling)
    init, _, _ = te_adapter.te_call(case, materialize(case), sel.UNFUSED)
    assert (init["attn_mask_type"], init["window_size"], init["bottom_right_diagonal"]) == (mask_type, window, brd)
    run("te-unfused", case)
    assert fake.inits[-1]["attn_mask_type"] == mask_type


def test_features_reach_the_module(fake):
    case = Case(sq=5, skv=7, h=4, hk=2, d_qk=16, d_v=8, softcap=3.0, scale=0.4, softmax="learnable",
                alibi_slopes=(0.1, 0.2, 0.3, 0.4), alignment="bottom_right", layout="sbhd")
    t, _ = run("te-unfused", case)
    init, fwd = fake.inits[-1], fake.forwards[-1]
    assert (init["num_attention_heads"], init["num_gqa_groups"], init["kv_channels"]) == (4, 2, (16, 8))
    assert (init["softcap"], init["softmax_scale"], init["softmax_type"], init["qkv_format"]) == (3.0, 0.4,
                                                                                             "learnable", "sbhd")
    assert init["attention_type"] == "cross" and fwd["core_attention_bias_type"] == "alibi"
    assert torch.equal(fwd["alibi_slopes"], t.alibi)
    case = Case(sq=6, skv=6, h=1, softmax="off_by_one", spelling="cross")
    run("te-unfused", case)
    assert (fake.inits[-1]["attention_type"], fake.inits[-1]["softmax_type"]) == ("cross", "off-by-one")


def test_padding_spellings(fake):
    case = Case(b=2, sq=6, skv=8, seqlens_q=(6, 3), seqlens_kv=(2, 8))
    run("te-unfused", case)
    assert fake.forwards[-1]["cu_seqlens_q"].tolist() == [0, 6, 9]
    assert fake.forwards[-1]["cu_seqlens_kv"].tolist() == [0, 2, 10]
    run("te-unfused", case.replace(spelling="attention_mask"))
    mask_q, mask_kv = fake.forwards[-1]["attention_mask"]
    assert mask_q.shape == (2, 1, 1, 6) and mask_kv.shape == (2, 1, 1, 8)
    assert mask_kv[0, 0, 0].tolist() == [False, False] + [True] * 6       # True = a padding token
    run("te-unfused", case.replace(spelling="forward-args"))
    assert fake.forwards[-1]["attn_mask_type"] == "padding"
    assert fake.inits[-1]["attn_mask_type"] == "causal"       # the fake TE's own default: the adapter passed none
    dense = case.replace(spelling="arbitrary", causal=True)
    t, _ = run("te-unfused", dense)
    assert fake.forwards[-1]["attention_mask"].shape == (2, 1, 6, 8)


# -- (b) end to end through grade() ------------------------------------------------------------------------------
COMMON = [
    Case(b=2, sq=12, skv=12, h=4, hk=2, causal=True, grads=True, **BF16),
    Case(sq=7, skv=13, causal=True, alignment="bottom_right", dtype="float16", grads=True),
    Case(sq=13, skv=7, causal=True, alignment="bottom_right", **BF16),
    Case(sq=9, skv=9, window=(3, 2), h=2, layout="sbhd", grads=True, **BF16),
    Case(b=3, sq=9, skv=11, seqlens_q=(9, 1, 4), seqlens_kv=(11, 0, 6), layout="thd", causal=True,
         alignment="bottom_right", grads=True, **BF16),
    Case(b=2, sq=8, skv=8, seqlens_q=(8, 3), seqlens_kv=(5, 8), causal=True, window=(2, None),
         alignment="bottom_right", memory="transposed", **BF16),
    Case(sq=9, skv=9, h=4, hk=2, memory="expanded_kv", d_qk=16, d_v=24, scale=0.7, grads=True, dtype="float16"),
    Case(b=2, sq=5, skv=6, seqlens_q=(0, 5), seqlens_kv=(6, 3), alignment="bottom_right", **BF16),
]
EXTRA = {
    "te-flash": [Case(b=2, sq=10, skv=10, h=2, seqlens_q=(10, 6), seqlens_kv=(10, 6), window=(3, 3),
                      alignment="bottom_right", **BF16)],
    "te-fused": [Case(sq=8, skv=11, h=2, softmax="learnable", causal=True, alignment="bottom_right", grads=True,
                      **BF16)],
    "te-unfused": [Case(sq=8, skv=8, h=2, softmax="off_by_one", softcap=2.0, window=(2, 1), dtype="float32"),
                   Case(sq=7, skv=9, h=2, mask_density=0.6, alibi_slopes=(0.3, 0.1), dtype="float32", seed=5),
                   Case(b=2, sq=6, skv=6, h=2, seqlens_q=(6, 4), seqlens_kv=(3, 6), alibi_slopes=(0.3, 0.1),
                        softmax="learnable", grads=True, **BF16)],
}


@pytest.mark.parametrize("name", NAMES)
def test_every_spelling_passes_grading(fake, name):
    adapter, graded = backend(name), 0
    for case in COMMON + EXTRA[name]:
        assert adapter.unsupported(case) is None, (case, adapter.unsupported(case))
        for spelling in adapter.spellings(case):
            spelled = case.replace(spelling=spelling)
            t = materialize(spelled)
            out = adapter.run(spelled, t)
            verdict = grade(spelled, t, out, family=adapter.family)
            assert verdict.status == V.PASS, (spelled, verdict.message)
            assert out.ran.startswith(adapter.te_backend)
            assert out.lse is None and (out.dq is not None) == case.grads
            graded += 1
    assert graded > 2 * len(COMMON)


def test_te_flash_surfaces_seed_003_through_fa4(monkeypatch):
    """TE hands FA4 causal=True with window (-1, 0); on FA4 after #2490 that band is empty, and te-flash must be
    graded FAIL:ALL_ZERO for it, while a genuine sliding window and a non-causal case still pass."""
    calls = []
    fa4 = fake_fa.make_fa4(calls, semantics="post_2490")["flash_attn.cute"]
    FakeTE(flash_impl=fa4_passthrough(fa4)).install(monkeypatch)
    labels = {}
    for label, case in (("causal", Case(sq=16, skv=16, h=2, causal=True, **BF16)),
                        ("sliding", Case(sq=16, skv=16, h=2, causal=True, window=(4, None), **BF16)),
                        ("full", Case(sq=16, skv=16, h=2, **BF16))):
        t, out = run("te-flash", case)
        labels[label] = grade(case, t, out).label
    assert labels == {"causal": "FAIL:ALL_ZERO", "sliding": "PASS", "full": "PASS"}
    assert (calls[0]["causal"], calls[0]["window_size"]) == (True, (-1, 0))


def test_te_flash_compile_key_is_the_fa4_call_te_makes(fake):
    """te-flash's compile key (compile-aware search) reads the FA4 call off TE's translation: runtime fields keep it,
    what FA4 compiles for changes it, and spellings TE folds into one FA4 call share it."""
    te = backend("te-flash")
    base = Case(b=2, sq=16, skv=16, h=4, hk=2, d_qk=64, d_v=64, **BF16)
    key = te.compile_key(base)
    assert key is not None
    for same in (base.replace(sq=9, skv=9), base.replace(b=1), base.replace(h=8, hk=4), base.replace(seed=3),
                 base.replace(scale=0.5), base.replace(spelling="forward-args")):
        assert te.compile_key(same) == key, same
    for other in (base.replace(dtype="float16"), base.replace(d_qk=128, d_v=128), base.replace(h=4, hk=1),
                  base.replace(causal=True), base.replace(window=(3, 3)), base.replace(grads=True),
                  base.replace(layout="sbhd"), base.replace(seqlens_q=(16, 5), seqlens_kv=(16, 7))):
        assert te.compile_key(other) != key, other
    causal = base.replace(causal=True)
    assert te.compile_key(causal.replace(spelling="explicit-window")) == te.compile_key(causal)    # both (-1, 0)
    assert te.compile_key(causal.replace(spelling="window")) != te.compile_key(causal)    # no_mask + (wide, 0)
    from attnfuzz.engine.harness import cases_for
    assert type(cases_for(te)).__name__ == "_CompileAware"   # its search draws inside compiled configurations
    fake.modules["transformer_engine.pytorch.attention.dot_product_attention.utils"].FlashAttentionUtils.\
        v4_is_installed = False
    assert te.compile_key(base) is None    # FA2 / FA3 are compiled ahead of time
    assert all(te_adapter.BACKENDS[n]("cpu").compile_key(base) is None for n in ("te-fused", "te-unfused"))


@pytest.mark.parametrize("case", [
    Case(sq=8, skv=8, h=2, causal=True, **BF16),
    Case(sq=8, skv=8, h=2, causal=True, window=(3, None), **BF16),
    Case(sq=8, skv=8, h=2, causal=True, spelling="window", **BF16),
    Case(sq=8, skv=8, h=2, causal=True, spelling="explicit-window", **BF16),
    Case(sq=8, skv=8, h=2, window=(2, 3), **BF16),
    Case(sq=8, skv=8, h=2, spelling="wide", **BF16),
    Case(sq=8, skv=8, h=2, **BF16),
    Case(sq=4, skv=8, h=2, causal=True, alignment="bottom_right", layout="sbhd", **BF16),
], ids=lambda c: f"{c.causal}-{c.window}-{c.spelling or 'default'}-{c.alignment}")
def test_flash_call_is_what_te_hands_fa4(monkeypatch, case):
    """flash_call (te-flash's compile key) against the fake TE's FA4 passthrough: the causal flag and the window TE's
    FlashAttention hands FA4."""
    from attnfuzz.backends.te.call import flash_call
    calls = []
    fa4 = fake_fa.make_fa4(calls)["flash_attn.cute"]
    FakeTE(flash_impl=fa4_passthrough(fa4)).install(monkeypatch)
    run("te-flash", case)
    causal, window, entry = flash_call(case)
    assert (calls[-1]["causal"], tuple(calls[-1]["window_size"]), entry) == (causal, window, "flash_attn_func")


# -- (c) capability rules ----------------------------------------------------------------------------------------
REFUSALS = [
    ("te-flash", Case(dtype="float32"), "dtype float32"),
    ("te-fused", Case(dtype="float32"), "dtype float32"),
    ("te-unfused", Case(dtype="float64"), "dtype float64"),
    ("te-flash", Case(mask_density=0.5, **BF16), "explicit boolean mask"),
    ("te-unfused", Case(b=2, sq=4, skv=4, seqlens_q=(4, 2), seqlens_kv=(4, 2), layout="thd", mask_density=0.5,
                        **BF16), "with thd"),
    ("te-flash", Case(softmax="learnable", **BF16), "sink softmax"),
    ("te-flash", Case(sq=4, skv=8, causal=True, **BF16), "top-left causal"),
    ("te-flash", Case(sq=4, skv=8, window=(1, 1), **BF16), "top-left sliding window"),
    ("te-fused", Case(softcap=5.0, **BF16), "softcap"),
    ("te-fused", Case(sq=8, skv=4, window=(1, 1), alignment="bottom_right", **BF16), "sq > skv"),
    ("te-flash", Case(spelling="arbitrary", **BF16), "not one of te-flash's spellings"),
    # first H200 run: refused by TE at run time, now declared (22 of 174 te-fused cases, 3 of 110 te-flash)
    ("te-fused", Case(d_qk=12, d_v=16, **BF16), "needs multiples of 8"),
    ("te-fused", Case(d_qk=16, d_v=3, **BF16), "needs multiples of 8"),
    ("te-flash", Case(d_qk=1, d_v=1, dtype="float16"), "FA4 needs 8..256"),
    # H100 ci streams: refused by TE at run time, now declared (te-fused 71 of its 500 cases, te-flash 21 of 427,
    # te-unfused 29 of 904)
    *[(name, Case(storage=("plain", "strided", "plain"), **BF16), "stride 1 in their last dimension")
      for name in ("te-flash", "te-fused", "te-unfused")],
    ("te-fused", Case(sq=1, skv=9, softmax="off_by_one", **BF16), "no decode-only mode with a sink token"),
]


@pytest.mark.parametrize("name,case,reason", REFUSALS)
def test_capability_refusals(fake, name, case, reason):
    got = backend(name).unsupported(case)
    assert got is not None and reason in got, got
    with pytest.raises(Unsupported):
        backend(name).run(case, materialize(case))
    assert fake.forwards == []


def test_fa4_specific_rows_follow_the_flash_version_te_loaded(fake):
    softcap = Case(softcap=5.0, **BF16)
    assert "TE does not pass softcap to FA4" in backend("te-flash").unsupported(softcap)
    fake.modules["transformer_engine.pytorch.attention.dot_product_attention.utils"].FlashAttentionUtils.\
        v4_is_installed = False
    assert backend("te-flash").unsupported(softcap) is None
    assert "loaded no flash-attn" in backend("te-flash").available() or "CUDA" in backend("te-flash").available()


def test_a_case_the_static_rules_refuse_is_refused_without_importing_te(monkeypatch):
    """te-flash's flash-attn rows need TE imported; the rows before them do not, and a case they refuse is refused
    without the import (report-bug asks every backend before importing any library). A case they take still asks."""
    asked = []
    monkeypatch.setattr(sel, "flash_versions", lambda: asked.append(1) or {"4": "4.0"})
    assert "dtype float32" in backend("te-flash").unsupported(Case(dtype="float32"))
    assert "top-left causal" in backend("te-flash").unsupported(Case(sq=4, skv=8, causal=True, **BF16))
    assert asked == []
    assert "TE does not pass softcap to FA4" in backend("te-flash").unsupported(Case(softcap=5.0, **BF16))
    assert asked


def test_storage_and_sink_rules_are_narrow(fake):
    """Controls: an offset or padded-rows buffer (last stride 1) is TE's to judge, and sink softmax with one query
    is refused by te-fused alone (te-unfused ran such cases and passed them on the H100)."""
    for storage in (("offset",) * 3, ("padded_rows",) * 3):
        assert backend("te-fused").unsupported(Case(storage=storage, **BF16)) is None, storage
    assert backend("te-unfused").unsupported(Case(sq=1, skv=9, softmax="off_by_one", **BF16)) is None
    assert backend("te-fused").unsupported(Case(sq=2, skv=9, softmax="off_by_one", **BF16)) is None
    assert backend("te-fused").unsupported(Case(sq=1, skv=9, **BF16)) is None


def test_head_dim_rules_are_narrow(fake):
    """Controls for the head-dim rows: unfused takes any head dim, fused any multiple of 8, and the FA4 row follows
    the architecture and applies only when TE loaded FA4."""
    odd = Case(d_qk=12, d_v=4, **BF16)
    assert backend("te-unfused").unsupported(odd) is None
    assert backend("te-fused").unsupported(Case(d_qk=24, d_v=8, **BF16)) is None

    def fa4_dims(case, major, arch):
        return [why for refused, why in te_adapter.capability_refusals(case, sel.FLASH, major, arch=arch)
                if refused and "FA4 needs" in why]

    hd192 = Case(d_qk=192, d_v=192, **BF16)
    assert fa4_dims(hd192, "4", 90) == [] and "sm100" in fa4_dims(hd192, "4", 100)[0]
    assert fa4_dims(odd, "4", 90) and fa4_dims(odd, "2", 90) == []
    fake.modules["transformer_engine.pytorch.attention.dot_product_attention.utils"].FlashAttentionUtils.\
        v4_is_installed = False
    assert backend("te-flash").unsupported(odd) is None


def test_no_eligible_backend_becomes_unsupported_with_te_reason(fake, monkeypatch):
    monkeypatch.setattr(te_adapter, "capability_refusals", lambda *a, **k: [])
    case = Case(softmax="learnable", **BF16)
    with pytest.raises(Unsupported, match="Disabling FlashAttention for softmax_type = learnable"):
        run("te-flash", case)


# -- (e) the backend asked for is the backend that ran ------------------------------------------------------------
@pytest.mark.parametrize("knob", ["misroute", "misrecord"])
def test_another_backend_running_raises(monkeypatch, knob):
    FakeTE(**{knob: sel.UNFUSED}).install(monkeypatch)
    case = Case(causal=True, **BF16)
    with pytest.raises(sel.BackendMismatch, match="asked for FusedAttention"):
        run("te-fused", case)


def test_honest_fake_passes_the_check(fake):
    for name, label in (("te-flash", "FlashAttention (flash-attn 4.0.0b36)"), ("te-fused", "FusedAttention"),
                        ("te-unfused", "UnfusedDotProductAttention")):
        assert run(name, Case(causal=True, **BF16))[1].ran.startswith(label)


def test_stale_cached_selection_is_caught(fake, monkeypatch):
    """TE reuses its last selection when the attention params match; forced_backend() marks it stale. Without
    that (control), te-flash after te-fused on the same shape reruns FusedAttention, and the check must raise."""
    case = Case(causal=True, **BF16)
    run("te-flash", case)
    assert run("te-fused", case)[1].ran.startswith(sel.FUSED)

    def env_only(wanted):
        os.environ.update(sel.ENV[wanted])
        return __import__("contextlib").nullcontext()

    monkeypatch.setattr(sel, "forced_backend", env_only)
    for name in sel.ENV[sel.FLASH]:
        monkeypatch.setenv(name, os.environ.get(name, "1"))     # monkeypatch restores whatever env_only sets
    with pytest.raises(sel.BackendMismatch, match="asked for FlashAttention.*called were .'FusedAttention'"):
        run("te-flash", case)


def test_environment_is_restored(fake, monkeypatch):
    monkeypatch.setenv("NVTE_FUSED_ATTN", "7")
    monkeypatch.delenv("NVTE_FLASH_ATTN", raising=False)
    run("te-unfused", Case(**BF16))
    assert os.environ["NVTE_FUSED_ATTN"] == "7" and "NVTE_FLASH_ATTN" not in os.environ


def test_registry_and_availability(fake):
    for name in NAMES:
        assert name in factories()
        assert "CUDA device" in backend(name).available()
        assert backend(name).version() == "2.20.2+fake"


def test_error_inside_the_selected_backend_is_a_crash_not_a_refusal(monkeypatch):
    def broken(spec, q, k, v):
        raise AssertionError("kernel does not support this shape")

    FakeTE(flash_impl=broken).install(monkeypatch)
    with pytest.raises(AssertionError, match="kernel does not support"):
        run("te-flash", Case(**BF16))


def test_gpu_check_cases_cover_every_backend():
    """bench/gpu_check.py's fixed cases: valid, and each GPU backend takes a good share of them on its CPU table."""
    from bench.gpu_check import BACKENDS, fixed_cases

    cases = fixed_cases()
    assert len(cases) >= 20 and len({label for label, _, _ in cases}) == len(cases)
    for name in BACKENDS:
        adapter = factories()[name]("cpu")
        taken = [label for label, case, _ in cases if adapter.unsupported(case) is None]
        assert len(taken) >= 10, (name, taken)
    assert all(any(factories()[n]("cpu").unsupported(c) is None for n in BACKENDS) for _, c, _ in cases)


def test_the_unfused_backend_is_graded_as_computing_its_logits_in_the_input_dtype():
    from attnfuzz.oracles.tolerance import LOGITS_IN_INPUT_DTYPE
    families = {name: factories()[name]().family for name in NAMES}
    assert families == {"te-flash": "te", "te-fused": "te-fused", "te-unfused": "te-unfused"}
    assert "te-unfused" in LOGITS_IN_INPUT_DTYPE and "te" not in LOGITS_IN_INPUT_DTYPE


def test_tes_layout_check_is_a_refusal_and_an_error_inside_a_backend_is_not():
    """TE's get_qkv_layout rejects strides and offsets it has no layout for (a tensor one element into its buffer)
    before entering a backend: UNSUPPORTED; the same words raised after a backend was entered stay a crash."""
    from attnfuzz.backends.te.selection import LAYOUT_REFUSED, Selection, refusal_reason
    error = RuntimeError(LAYOUT_REFUSED + "!")
    assert "TE refused the case" in refusal_reason("FusedAttention", error, Selection())
    assert refusal_reason("FusedAttention", error, Selection(entered=["FusedAttention"])) is None
    assert refusal_reason("FusedAttention", RuntimeError("CUDA error"), Selection()) is None
