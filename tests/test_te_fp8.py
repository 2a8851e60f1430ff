"""te-fused-fp8 (TransformerEngine's FP8 attention) against the fake TE on CPU: the Float8Tensors, recipe and S / O
scales in the call, the backward's dO and scales, the mask translation, the refusals naming their field, the streams
(FP8 cases for te-fused-fp8, none for te-fused), the repro script's call, and planted FP8 bugs, forward and backward,
found by fuzzing with the correct fake as the negative control."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from attnfuzz.backends import get
from attnfuzz.backends.te import fp8 as te_fp8
from attnfuzz.engine.harness import cases_for, fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.space import Space
from tests.fakes import te_fp8 as fake_fp8
from tests.fakes.transformer_engine import FakeTE

NAME = "te-fused-fp8"
FP8 = dict(fp8=("e4m3",) * 3, fp8_out="e4m3", fp8_p="e4m3", fp8_scales="any")
CASE = Case(b=2, sq=6, skv=9, h=4, hk=2, d_qk=32, d_v=16, dtype="bfloat16", causal=True, seed=3, **FP8)
SPACE = Space(max_len=48, max_heads=4, max_head_dim=64)
BUGS = ("descale_twice", "q_scale_ignored", "p_scale_kept", "o_scale_ignored")
GRADS = CASE.replace(grads=True, fp8_dout="e5m2", fp8_ds="e5m2", fp8_dqkv="e5m2")


def install(monkeypatch, **knobs) -> FakeTE:
    fake = FakeTE(**knobs).install(monkeypatch)
    recorded = []
    forward = fake.modules["transformer_engine.pytorch"].DotProductAttention.forward

    def spy(dpa, q, k, v, **kwargs):   # the inputs and the S / O scales as the call sees them
        recorded.append(dict(q=q, k=k, v=v, scale=dpa.fp8_meta["scaling_fwd"].scale.clone(),
                             recipe=fake_fp8.STATE["recipe"], enabled=fake_fp8.STATE["enabled"]))
        return forward(dpa, q, k, v, **kwargs)
    monkeypatch.setattr(fake.modules["transformer_engine.pytorch"].DotProductAttention, "forward", spy)
    fake.calls = recorded
    return fake


@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
@pytest.mark.parametrize("spelling", te_fp8.SPELLINGS)
def test_the_call_hands_over_the_encodings_descales_and_scales(monkeypatch, spelling, layout):
    fake = install(monkeypatch)
    case = CASE.replace(spelling=spelling, layout=layout)
    backend = get(NAME, "cpu")
    assert backend.unsupported(case) is None, backend.unsupported(case)
    t = materialize(case)
    out = backend.run(case, t)
    call, fwd, init = fake.calls[-1], fake.forwards[-1], fake.inits[-1]
    for name in "qkv":
        x, x8 = call[name], getattr(t.fp8, f"{name}8")
        x8 = x8.transpose(0, 1) if layout == "sbhd" else x8
        assert isinstance(x, fake_fp8.Float8Tensor) and x._fp8_dtype == fake_fp8.DType.kFloat8E4M3
        assert torch.equal(x._data, x8.contiguous().view(torch.uint8)) and x.dtype == torch.bfloat16
        assert x._scale_inv.item() == getattr(t.fp8, f"{name}_descale")[0].item()
    assert {call[n]._scale_inv.item() for n in "qkv"} - {1.0}, "any scales: a dropped descale would show"
    assert call["enabled"] and call["recipe"].fp8_dpa
    assert call["recipe"].fp8_format == (fake_fp8.Format.E4M3 if spelling == "e4m3-format" else fake_fp8.Format.HYBRID)
    assert call["scale"][fake_fp8.META_S].item() == t.fp8.p_scale
    assert call["scale"][fake_fp8.META_O].item() == pytest.approx(1 / t.fp8.out_descale.item(), rel=1e-7)
    assert fwd["fp8_output"] == (spelling == "fp8-output") and init["qkv_format"] == layout
    mask = init["attn_mask_type"] if spelling != "forward-args" else fwd["attn_mask_type"]
    assert mask == ("padding_causal" if spelling == "padding" else "causal")
    assert "FP8" in out.ran and grade(case, t, out, family=backend.family).status == V.PASS


def test_a_bottom_right_causal_band_of_equal_lengths_goes_as_top_left_causal(monkeypatch):
    fake = install(monkeypatch)
    case = CASE.replace(b=2, sq=8, skv=8, seqlens_q=(8, 3), seqlens_kv=(8, 3), alignment="bottom_right")
    backend = get(NAME, "cpu")
    assert backend.unsupported(case) is None
    t = materialize(case)
    assert grade(case, t, backend.run(case, t), family=backend.family).status == V.PASS
    assert fake.inits[-1]["attn_mask_type"] == "padding_causal" and fake.inits[-1]["bottom_right_diagonal"] is False
    assert fake.forwards[-1]["cu_seqlens_q"].tolist() == [0, 8, 11]


REFUSALS = [
    (CASE.replace(fp8=None, fp8_out=None, fp8_p=None, fp8_scales="unit"), "FP8 cases only"),
    (CASE.replace(fp8=(None, "e4m3", "e4m3")), "fp8[0]=None"),
    (CASE.replace(fp8=("e4m3", "e5m2", "e4m3")), "Pure E5M2 training"),
    (CASE.replace(fp8=("e5m2",) * 3), "the forward format is e4m3"),
    (CASE.replace(fp8_out=None), "fp8_out=None"),
    (CASE.replace(fp8_out="e5m2"), "fp8_out='e5m2'"),
    (CASE.replace(fp8_p=None), "fp8_p=None"),
    (CASE.replace(fp8_scaling="head"), "fp8_scaling='head'"),
    (CASE.replace(dtype="float32"), "dtype float32"),
    (CASE.replace(layout="thd", seqlens_q=(6, 2), seqlens_kv=(9, 4)), "thd"),
    (CASE.replace(page_size=4, seqlens_kv=(9, 4)), "paged KV cache"),
    (CASE.replace(causal=False, mask_density=0.5), "explicit boolean mask"),
    (CASE.replace(alibi_slopes=(0.1, 0.2, 0.3, 0.4)), "ALiBi"),
    (CASE.replace(softcap=5.0), "softcap"),
    (CASE.replace(softmax="learnable"), "softmax=learnable"),
    (CASE.replace(causal=False, window=(2, 3)), "sliding windows"),
    (CASE.replace(window=(3, None)), "sliding windows"),
    (CASE.replace(alignment="bottom_right"), "bottom-right causal"),
    (CASE.replace(d_qk=24, d_v=24), "head dims (24, 24)"),
    (CASE.replace(d_qk=512, d_v=512), "up to 256"),
    (CASE.replace(spelling="window"), "spelling='window'"),
    (CASE.replace(seqlens_q=(6, 2), seqlens_kv=(9, 4), spelling="padding"), "spelling='padding'"),
    (GRADS.replace(fp8_dout="e4m3", fp8_ds="e4m3", fp8_dqkv="e4m3"), "fp8_dout='e4m3': TE's dO quantizer under HYBRID"),
    (GRADS.replace(spelling="e4m3-format"), "fp8_dout='e5m2': TE's dO quantizer under E4M3"),
    (GRADS.replace(fp8_ds=None), "fp8_ds=None"),
    (GRADS.replace(fp8_ds="e4m3"), "fp8_ds='e4m3'"),
    (GRADS.replace(fp8_dqkv=None), "fp8_dqkv=None"),
    (GRADS.replace(fp8_dqkv="e4m3"), "fp8_dqkv='e4m3'"),
    (GRADS.replace(fp8_scaling="head"), "fp8_scaling='head'"),
    (GRADS.replace(d_qk=192, d_v=192), "FP8 backward takes multiples of 16 up to 128"),
]


@pytest.mark.parametrize("case, reason", REFUSALS, ids=[r for _, r in REFUSALS])
def test_what_te_fused_fp8_refuses_names_the_field(case, reason):
    refused = get(NAME, "cpu").unsupported(case)
    assert refused is not None and reason in refused, refused


def test_gradients_are_taken_in_the_recipes_one_backward_format():
    """FP8 gradients run TE's FP8 backward: dO, dS and dQ / dK / dV in e5m2 under HYBRID (every spelling but
    e4m3-format), in e4m3 under the e4m3-format spelling only."""
    backend = get(NAME, "cpu")
    e4m3 = GRADS.replace(fp8_dout="e4m3", fp8_ds="e4m3", fp8_dqkv="e4m3")
    assert backend.spellings(GRADS) == tuple(s for s in te_fp8.SPELLINGS if s != "e4m3-format")
    assert backend.spellings(e4m3) == ("e4m3-format",)
    assert backend.unsupported(GRADS) is None and backend.unsupported(e4m3.replace(spelling="e4m3-format")) is None
    assert backend.fp8_backward and backend.repro_source(GRADS) is None   # the repro script is the forward's


def spy_backward(monkeypatch) -> list:
    """Each fake backward's dO and the fwd / bwd scales as it reads them."""
    seen, real = [], fake_fp8.backward

    def spy(dpa, spec, lengths, q, k, v, o8, dout):
        seen.append(dict(dout=dout, fwd=dpa.fp8_meta["scaling_fwd"].scale.clone(),
                         bwd=dpa.fp8_meta["scaling_bwd"].scale.clone()))
        return real(dpa, spec, lengths, q, k, v, o8, dout)
    monkeypatch.setattr(fake_fp8, "backward", spy)
    return seen


@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
@pytest.mark.parametrize("spelling", te_fp8.SPELLINGS)
def test_the_backward_gets_the_do_encodings_and_the_cases_scales(monkeypatch, spelling, layout):
    install(monkeypatch)
    seen = spy_backward(monkeypatch)
    fmt = "e4m3" if spelling == "e4m3-format" else "e5m2"
    case = GRADS.replace(spelling=spelling, layout=layout, fp8_dout=fmt, fp8_ds=fmt, fp8_dqkv=fmt)
    backend, t = get(NAME, "cpu"), materialize(case)
    out = backend.run(case, t)
    descales = [getattr(t.fp8, f"d{x}_descale")[0].item() for x in "qkv"]
    assert len(set(descales)) > 1 and len(seen) == len(set(descales)), "one run per distinct dQKV descale"
    dout8 = t.fp8.dout8.transpose(0, 1) if layout == "sbhd" else t.fp8.dout8
    for run, d in zip(seen, dict.fromkeys(descales)):
        dout = run["dout"]
        assert isinstance(dout, fake_fp8.Float8Tensor)
        assert dout._fp8_dtype == (fake_fp8.DType.kFloat8E4M3 if fmt == "e4m3" else fake_fp8.DType.kFloat8E5M2)
        assert torch.equal(dout._data.reshape(dout8.shape), dout8.contiguous().view(torch.uint8))
        assert dout._scale_inv.item() == t.fp8.dout_descale[0].item() != 1.0
        assert run["bwd"][fake_fp8.META_DP].item() == t.fp8.ds_scale
        assert run["bwd"][fake_fp8.META_DQKV].item() == pytest.approx(1 / d, rel=1e-7)
        assert run["fwd"][fake_fp8.META_S].item() == t.fp8.p_scale, "the backward reads the forward's scale_s"
    assert all(g is not None for g in (out.dq, out.dk, out.dv))
    assert grade(case, t, out, family=backend.family).status == V.PASS


def test_sm100_lifts_the_hopper_rules():
    for case in (CASE.replace(softmax="learnable"), CASE.replace(window=(3, None)), CASE.replace(
            alignment="bottom_right")):
        assert te_fp8.first_reason(*te_fp8.fp8_refusals(case, 100)) is None, case
    assert "up to 128" in te_fp8.first_reason(*te_fp8.fp8_refusals(CASE.replace(d_qk=256, d_v=256), 100))


@pytest.mark.parametrize("name", ["te-fused", "te-flash", "te-unfused"])
def test_the_plain_te_backends_refuse_fp8_cases(name):
    case = CASE.replace(sq=8, skv=8)
    refused = get(name, "cpu").unsupported(case)
    assert refused is not None and "te-fused-fp8" in refused, refused
    assert get(name, "cpu").unsupported(case.replace(fp8=None, fp8_out=None, fp8_p=None, fp8_scales="unit")) is None


def test_fp8_attention_not_taken_is_a_mismatch_not_a_pass(monkeypatch):
    install(monkeypatch, fp8_bug="fp8_off")
    with pytest.raises(te_fp8.NotFP8, match="without FP8 attention"):
        get(NAME, "cpu").run(CASE, materialize(CASE))


def test_the_streams_draw_fp8_cases_for_te_fused_fp8_and_none_for_te_fused():
    seen = {}
    for name in (NAME, "te-fused"):
        backend, kinds = get(name, "cpu"), set()

        @settings(max_examples=60, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=cases_for(backend, SPACE))
        def check(case):
            kinds.add(((case.fp8, case.fp8_out, case.fp8_p, case.fp8_scaling), case.spelling,
                       backend.unsupported(case) is None))

        check()
        seen[name] = kinds
    assert {k[0] for k in seen[NAME]} == {(("e4m3",) * 3, "e4m3", "e4m3", "tensor")}, seen[NAME]
    assert sum(ok for *_, ok in seen[NAME]) >= len(seen[NAME]) // 2 and len({k[1] for k in seen[NAME]}) >= 4
    assert {k[0][0] for k in seen["te-fused"]} == {None}


def test_fuzzing_through_a_correct_fake_finds_nothing(monkeypatch):
    """Negative control of the planted bugs below: the same derandomized stream through the correct fake."""
    install(monkeypatch)
    tally, findings = fuzz(get(NAME, "cpu"), space=SPACE, settings=profile("ci", max_examples=120))
    assert not findings, [f"{f.verdict.label} {f.verdict.message[:200]} {f.case!r}" for f in findings]
    assert tally.labels["PASS"] >= 60, tally.to_dict()


@pytest.mark.parametrize("bug", BUGS)
def test_a_planted_fp8_bug_is_found(monkeypatch, bug):
    install(monkeypatch, fp8_bug=bug)
    _, findings = fuzz(get(NAME, "cpu"), space=SPACE, settings=profile("ci", max_examples=120))
    assert findings, f"{bug} went unseen"
    assert findings[0].case.fp8 == ("e4m3",) * 3 and findings[0].verdict.failed


def test_the_repro_script_makes_the_adapters_call_and_can_fail(tmp_path, monkeypatch):
    from tests.test_repro_scripts import assert_standalone_and_able_to_fail, comparable, write
    fake = FakeTE().install(monkeypatch)
    case = CASE.replace(b=2, sq=5, skv=7, seqlens_q=(5, 2), seqlens_kv=(7, 3), layout="sbhd", spelling="fp8-output")
    backend = get(NAME, "cpu")
    assert backend.unsupported(case) is None, backend.unsupported(case)
    backend.run(case, materialize(case))
    source = backend.repro_source(case)
    assert "te.Float8Tensor(" in source and "META_S" in source and "fp8_output=True" in source
    script_calls = assert_standalone_and_able_to_fail(write(tmp_path, NAME, case), fake="te")
    assert [json.loads(comparable(c)) for c in fake.forwards] == script_calls["forwards"]
    assert script_calls["selected"] == ["use_fused_attention"]


GRAD_SPACE = SPACE.replace(fp8_grads=1)


def test_fuzzing_gradients_through_a_correct_fake_finds_nothing(monkeypatch):
    """Negative control of the planted backward bugs below: every FP8 case of the stream checks gradients."""
    install(monkeypatch)
    seen = spy_backward(monkeypatch)
    tally, findings = fuzz(get(NAME, "cpu"), space=GRAD_SPACE, settings=profile("ci", max_examples=80))
    assert not findings, [f"{f.verdict.label} {f.verdict.message[:200]} {f.case!r}" for f in findings]
    assert tally.labels["PASS"] >= 30 and len(seen) >= 30, (tally.to_dict(), len(seen))


@pytest.mark.parametrize("bug", fake_fp8.BACKWARD_BUGS)
def test_a_planted_fp8_backward_bug_is_found(monkeypatch, bug):
    install(monkeypatch, fp8_bug=bug)
    _, findings = fuzz(get(NAME, "cpu"), space=GRAD_SPACE, settings=profile("ci", max_examples=80))
    assert findings, f"{bug} went unseen"
    assert findings[0].case.grads and findings[0].verdict.failed
