"""FlashInfer's paged wrappers over an FP8 KV cache (flashinfer-paged-*-fp8kv) against the fake flashinfer on CPU:
the FP8 pool, dtypes and scales in the call, the refusals naming their field, the streams (FP8 cases for the fp8kv
backends, none for the plain ones), the repro script's call, and planted scale / format bugs caught by fuzzing with
the correct fake as the negative control."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from attnfuzz.backends import factories
from attnfuzz.engine.harness import cases_for, fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.space import Space
from tests.fakes import flashinfer as fake

PREFILL, DECODE = "flashinfer-paged-prefill-fp8kv", "flashinfer-paged-decode-fp8kv"
KV8 = Case(b=3, sq=5, skv=37, h=4, hk=2, seqlens_q=(5, 2, 1), seqlens_kv=(37, 16, 3), page_size=16, seed=4,
           alignment="bottom_right", causal=True, dtype="float16", d_qk=64, d_v=64, fp8=(None, "e4m3", "e4m3"),
           fp8_scales="any")
CASES = {PREFILL: KV8, DECODE: KV8.replace(sq=1, seqlens_q=None, causal=False, window=(6, None))}
KNOBS = ("v_scale_ignored", "k_scale_twice", "e5m2_as_e4m3")


class Knobs(fake.Knobs):
    pass


@pytest.fixture
def calls(monkeypatch):
    for knob in KNOBS:
        setattr(Knobs, knob, False)
    recorded: list = []
    fake.install(monkeypatch, fake.make_flashinfer(recorded, Knobs))
    return recorded


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("spelling", ["", "hnd+kv_tensor"])
@pytest.mark.parametrize("name", [PREFILL, DECODE])
def test_the_pool_holds_the_encodings_and_run_gets_the_descales(calls, name, spelling, fmt):
    case = CASES[name].replace(fp8=(None, fmt, fmt), spelling=spelling, dtype="bfloat16")
    backend = factories()[name]("cpu")
    assert backend.unsupported(case) is None, backend.unsupported(case)
    t = materialize(case)
    out = backend.run(case, t)
    call = calls[-1]
    assert call["kv_data_type"] == repr({"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt])
    assert call["q_data_type"] == "torch.bfloat16" and out.out.dtype == torch.bfloat16
    assert call["k_scale"] == float(t.fp8.k_descale[0]) and call["v_scale"] == float(t.fp8.v_descale[0])
    assert call["k_scale"] != 1.0 and call["v_scale"] != 1.0          # "any" scales: a dropped one would show
    assert grade(case, t, out, family=backend.family).status == V.PASS


REFUSALS = [
    (KV8.replace(fp8=("e4m3",) * 3), "fp8[0]='e4m3'"),
    (KV8.replace(fp8=(None, "e4m3", "e5m2")), "one kv_data_type"),
    (KV8.replace(fp8_out="e4m3"), "fp8_out='e4m3'"),
    (KV8.replace(fp8_p="e4m3"), "fp8_p='e4m3'"),
    (KV8.replace(fp8_scaling="head"), "fp8_scaling='head'"),
    (KV8.replace(fp8_scaling="page"), "one k_scale / v_scale float per call"),
    (KV8.replace(fp8=None, fp8_scales="unit"), "FP8 KV caches only"),
    (KV8.replace(dtype="float32"), "dtype float32"),
]


@pytest.mark.parametrize("case, reason", REFUSALS)
def test_what_the_fp8_paged_wrappers_refuse_names_the_field(case, reason):
    refused = factories()[PREFILL]("cpu").unsupported(case)
    assert refused is not None and reason in refused, refused


@pytest.mark.parametrize("name", ["flashinfer-paged-prefill", "flashinfer-ragged", "flashinfer-single-prefill"])
def test_the_plain_backends_refuse_fp8_cases(name):
    case = KV8 if name.endswith("paged-prefill") else KV8.replace(page_size=None, b=1, seqlens_q=None,
                                                                   seqlens_kv=None)
    refused = factories()[name]("cpu").unsupported(case)
    assert refused is not None and "fp8kv" in refused, refused
    assert factories()[name]("cpu").unsupported(case.replace(fp8=None, fp8_scales="unit")) is None


def test_the_fp8kv_streams_draw_fp8_kv_caches_and_the_plain_ones_none():
    seen = {}
    for name in (PREFILL, DECODE, "flashinfer-paged-decode"):
        backend, kinds = factories()[name]("cpu"), set()

        @settings(max_examples=40, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=cases_for(backend, Space(max_len=48)))
        def check(case):
            kinds.add((case.fp8 and (case.fp8[0], case.fp8[1] == case.fp8[2], case.fp8_scaling),
                       backend.unsupported(case) is None))

        check()
        seen[name] = kinds
    for name in (PREFILL, DECODE):
        assert {kind[0] for kind, _ in seen[name]} == {None} and {kind[1:] for kind, _ in seen[name]} == {
            (True, "tensor")}, seen[name]
        assert any(ok for _, ok in seen[name]), seen[name]
    assert {kind for kind, _ in seen["flashinfer-paged-decode"]} == {None}


def test_the_compile_key_names_the_cache_format():
    backend = factories()[PREFILL]("cpu")
    keys = {backend.compile_key(KV8.replace(fp8=(None, f, f))) for f in ("e4m3", "e5m2")}
    assert len(keys) == 2 and all(key[-1] in ("e4m3", "e5m2") for key in keys)


@pytest.mark.parametrize("name", [PREFILL, DECODE])
def test_fuzzing_through_a_correct_fake_finds_nothing(calls, name):
    """Negative control of the planted bugs below: the same derandomized stream through the correct fake."""
    tally, findings = fuzz(factories()[name]("cpu"), space=Space(max_len=48, max_heads=4),
                           settings=profile("ci", max_examples=120))
    assert not findings, [f"{f.verdict.label} {f.verdict.message[:200]} {f.case!r}" for f in findings]
    assert tally.labels["PASS"] >= 60, tally.to_dict()


@pytest.mark.parametrize("knob", KNOBS)
@pytest.mark.parametrize("name", [PREFILL, DECODE])
def test_a_planted_fp8_bug_is_found(calls, name, knob):
    setattr(Knobs, knob, True)
    _, findings = fuzz(factories()[name]("cpu"), space=Space(max_len=48, max_heads=4),
                       settings=profile("ci", max_examples=120))
    assert findings, f"{knob} went unseen"
    case = findings[0].case
    assert case.fp8 is not None and (knob != "e5m2_as_e4m3" or case.fp8[1] == "e5m2"), case


@pytest.mark.parametrize("name", [PREFILL, DECODE])
def test_the_repro_script_makes_the_adapters_call_and_can_fail(tmp_path, calls, name):
    from tests.test_repro_scripts import assert_standalone_and_able_to_fail, comparable, write
    backend, case = factories()[name]("cpu"), CASES[name].replace(fp8=(None, "e5m2", "e5m2"), spelling="hnd",
                                                                   shared_prefix_pages=1, seqlens_kv=(37, 16, 20))
    assert backend.unsupported(case) is None, backend.unsupported(case)
    backend.run(case, materialize(case))
    script_calls = assert_standalone_and_able_to_fail(write(tmp_path, name, case), fake="flashinfer")
    assert [json.loads(comparable(c)) for c in calls] == script_calls
    assert script_calls[0]["k_scale"] != 1.0 and script_calls[0]["kv_data_type"] == "torch.float8_e5m2"
