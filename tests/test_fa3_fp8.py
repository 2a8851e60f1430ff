"""FA3's FP8 forward (fa3-fp8) against the fake flash_attn_interface on CPU: the encodings and [b, hk] descales in the
call, the refusals naming their field, the build's recorded switches, the streams (FP8 cases for fa3-fp8, none for
fa3), the repro script's call, and planted scale bugs caught by fuzzing with the correct fake as the negative
control."""

from __future__ import annotations

import json
import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from attnfuzz.backends import factories
from attnfuzz.backends.flash import fa3
from attnfuzz.engine.harness import cases_for, fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.space import Space
from tests.fakes import flash_attn as fake

NAME = "fa3-fp8"
E4M3 = ("e4m3",) * 3
FP8 = Case(b=2, sq=6, skv=9, h=4, hk=2, d_qk=32, d_v=32, dtype="bfloat16", fp8=E4M3, fp8_p="e4m3", fp8_scales="any",
           seed=5)
HEAD = FP8.replace(h=2, fp8_scaling="head")
PADDED = HEAD.replace(seqlens_q=(6, 2), seqlens_kv=(9, 4), causal=True, alignment="bottom_right")
SPACE = Space(max_len=40, max_heads=4)


def install(monkeypatch, bug=None) -> list:
    calls: list = []
    fake.install(monkeypatch, fake.make_fa3(calls, fp8_bug=bug))
    return calls


@pytest.mark.parametrize("case", [FP8, HEAD, PADDED], ids=["tensor-gqa", "head", "head-varlen"])
def test_the_call_gets_e4m3_encodings_and_b_by_hk_descales(monkeypatch, case):
    calls = install(monkeypatch)
    backend = factories()[NAME]("cpu")
    assert backend.unsupported(case) is None, backend.unsupported(case)
    t = materialize(case)
    out = backend.run(case, t)
    call = calls[-1]
    assert call["fn"] == ("flash_attn_varlen_func" if case.padded else "flash_attn_func")
    assert call["dtype"] == "torch.float8_e4m3fn" and out.out.dtype == torch.bfloat16
    group = case.h // case.hk
    want = {"q": t.fp8.q_descale[::group], "k": t.fp8.k_descale, "v": t.fp8.v_descale}
    for name, per_kv in want.items():
        assert call[f"{name}_descale"] == [per_kv.tolist()] * case.b, name
    assert len(set(call["k_descale"][0])) == (case.hk if case.fp8_scaling == "head" else 1)
    assert grade(case, t, out, family=backend.family).status == V.PASS


REFUSALS = [
    (FP8.replace(fp8=None, fp8_p=None, fp8_scales="unit"), "FP8 cases only"),
    (FP8.replace(fp8=(None, "e4m3", "e4m3")), "q in k's and v's dtype"),
    (FP8.replace(fp8=("e5m2",) * 3), "float8_e4m3fn only"),
    (FP8.replace(fp8=("e4m3", "e4m3", "e5m2")), "float8_e4m3fn only"),
    (FP8.replace(fp8_out="e4m3"), "fp8_out='e4m3'"),
    (FP8.replace(fp8_p=None), "fp8_p=None"),
    (FP8.replace(dtype="float16"), "dtype float16"),
    (FP8.replace(fp8_scaling="head"), "fp8_scaling='head' with h=4, hk=2"),
    (FP8.replace(fp8_scaling="page", page_size=4), "fp8_scaling='page'"),
    (FP8.replace(page_size=4), "page_table"),
    (FP8.replace(layout="sbhd"), "layout sbhd"),
    (FP8.replace(d_qk=40, d_v=40), "multiples of 16"),
    (FP8.replace(d_qk=320, d_v=320), "d_qk=320 > 256"),
]


@pytest.mark.parametrize("case, reason", REFUSALS)
def test_what_fa3_fp8_refuses_names_the_field(case, reason):
    refused = factories()[NAME]("cpu").unsupported(case)
    assert refused is not None and reason in refused, refused


def test_the_plain_fa3_refuses_fp8_cases_and_takes_the_same_case_unquantised():
    plain = factories()["fa3"]("cpu")
    refused = plain.unsupported(FP8)
    assert refused is not None and "fa3-fp8" in refused, refused
    assert plain.unsupported(FP8.replace(fp8=None, fp8_p=None, fp8_scales="unit")) is None


@pytest.fixture
def built_with(monkeypatch):
    """Install a fake `flash_attn_config` recording the given switches (as hopper/setup.py writes it)."""
    def with_flags(**flags):
        module = types.ModuleType("flash_attn_config")
        module.CONFIG = {"build_flags": flags}
        monkeypatch.setitem(__import__("sys").modules, "flash_attn_config", module)
        fa3.build_flags.cache_clear()
    yield with_flags
    fa3.build_flags.cache_clear()


def test_a_builds_left_out_head_dim_pairs_are_refused_and_kept_where_built(monkeypatch, built_with):
    plain = factories()["fa3"]("cpu")
    wide_v = Case(h=2, d_qk=64, d_v=256, dtype="bfloat16")
    narrow_v = Case(h=2, d_qk=192, d_v=128, dtype="bfloat16")
    built_with()
    assert plain.unsupported(wide_v) is None and plain.unsupported(narrow_v) is None
    built_with(FLASH_ATTENTION_DISABLE_HDIMDIFF64=True, FLASH_ATTENTION_DISABLE_HDIMDIFF192=False)
    assert "FLASH_ATTENTION_DISABLE_HDIMDIFF64" in plain.unsupported(wide_v)
    assert plain.unsupported(narrow_v) is None
    built_with(FLASH_ATTENTION_DISABLE_HDIMDIFF192=True)
    assert "FLASH_ATTENTION_DISABLE_HDIMDIFF192" in plain.unsupported(narrow_v)


def test_a_build_without_fp8_kernels_makes_fa3_fp8_unavailable(monkeypatch, built_with):
    install(monkeypatch)
    backend = factories()[NAME]("cpu")
    monkeypatch.setattr(fa3.FlashAttn3, "available", lambda self: None)   # the CPU has no sm90 to report
    built_with(FLASHATTENTION_DISABLE_FP8=False)
    assert backend.available() is None
    built_with(FLASHATTENTION_DISABLE_FP8=True)
    assert "FLASHATTENTION_DISABLE_FP8" in backend.available()


def test_fa3_fp8_draws_e4m3_cases_only_and_fa3_none():
    seen = {}
    for name in (NAME, "fa3"):
        backend, kinds = factories()[name]("cpu"), set()

        @settings(max_examples=40, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=cases_for(backend, SPACE))
        def check(case):
            kinds.add((case.fp8, case.fp8_p, case.fp8_out, case.dtype if case.fp8 else None,
                       backend.unsupported(case) is None))

        check()
        seen[name] = kinds
    assert {k[:4] for k in seen[NAME]} == {(E4M3, "e4m3", None, "bfloat16")}, seen[NAME]
    assert any(k[4] for k in seen[NAME]), seen[NAME]
    assert {k[:4] for k in seen["fa3"]} == {(None, None, None, None)}, seen["fa3"]


def test_fuzzing_through_a_correct_fake_finds_nothing(monkeypatch):
    """Negative control of the planted bugs below: the same derandomized stream through the correct fake."""
    install(monkeypatch)
    tally, findings = fuzz(factories()[NAME]("cpu"), space=SPACE, settings=profile("ci", max_examples=120))
    assert not findings, [f"{f.verdict.label} {f.verdict.message[:200]} {f.case!r}" for f in findings]
    assert tally.labels["PASS"] >= 60, tally.to_dict()


@pytest.mark.parametrize("bug", fake.FA3_FP8_BUGS)
def test_a_planted_fp8_scale_bug_is_found(monkeypatch, bug):
    install(monkeypatch, bug)
    _, findings = fuzz(factories()[NAME]("cpu"), space=SPACE, settings=profile("ci", max_examples=120))
    assert findings, f"{bug} went unseen"
    case = findings[0].case
    assert case.fp8 == E4M3 and (bug != "v_descale_heads_swapped" or case.fp8_scaling == "head"), case


def test_the_fake_refuses_e5m2_as_fa3_does(monkeypatch):
    """The refusal above stands for a check FA3 makes: the fake, like mha_fwd, raises on e5m2 encodings."""
    install(monkeypatch)
    api = __import__("sys").modules["flash_attn_interface"]
    x = torch.zeros(1, 4, 2, 16).to(torch.float8_e5m2)
    with pytest.raises(RuntimeError, match="fp8_e4m3"):
        api.flash_attn_func(x, x, x)


@pytest.mark.parametrize("case", [HEAD, PADDED], ids=["batched", "varlen"])
def test_the_repro_script_makes_the_adapters_call_and_can_fail(tmp_path, monkeypatch, case):
    from tests.test_repro_scripts import assert_standalone_and_able_to_fail, comparable, write
    calls = install(monkeypatch)
    factories()[NAME]("cpu").run(case, materialize(case))
    script_calls = assert_standalone_and_able_to_fail(write(tmp_path, NAME, case), fake="fa3")
    assert [json.loads(comparable(c)) for c in calls] == script_calls
    assert script_calls[0]["dtype"] == "torch.float8_e4m3fn" and script_calls[0]["k_descale"][0][0] != 1.0


def test_p_is_bounded_at_fa3s_own_scale_whatever_the_case_draws():
    """FA3 rounds P at 2^8 (its Max_offset): a case drawn with p_scale 448 is bounded for FA3 as P rounded at 256,
    whose subnormal steps are larger in units of P; at 256 both bounds agree."""
    import dataclasses
    from attnfuzz.oracles import fp8 as fp8_oracle
    from attnfuzz.oracles.reference import reference
    t = materialize(FP8, "cpu")
    ref = reference(FP8, t)
    at = {p: dataclasses.replace(t, fp8=dataclasses.replace(t.fp8, p_scale=p)) for p in (256.0, 448.0)}
    fa3_448, default_448 = (fp8_oracle.allowance(FP8, at[448.0], ref, family) for family in ("fa3", "default"))
    assert bool((fa3_448 > default_448).any()) and bool((fa3_448 >= default_448).all())
    assert torch.equal(fp8_oracle.allowance(FP8, at[256.0], ref, "fa3"), fp8_oracle.allowance(FP8, at[256.0], ref))
