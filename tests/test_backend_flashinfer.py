"""The FlashInfer adapters against a fake flashinfer (tests/fakes/flashinfer.py) on CPU: the paged metadata and the
call arguments per entry point and spelling, end-to-end grading, planted wrong conventions in the fake (a base-e LSE,
a read one slot past the cache) caught, the capability table, availability, and fuzzing clean through the fake."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings

from attnfuzz.backends import factories
from attnfuzz.backends.flashinfer import adapter as fia
from attnfuzz.backends.flashinfer import common as fic
from attnfuzz.engine.harness import cases_for, fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.paged import paged_kv
from attnfuzz.strategies.space import Space
from tests.fakes import flashinfer as fake

F16 = dict(dtype="float16", d_qk=64, d_v=64)
PAGED = Case(b=3, sq=5, skv=37, h=4, hk=2, seqlens_q=(5, 2, 1), seqlens_kv=(37, 16, 3), page_size=16, seed=4,
             alignment="bottom_right", causal=True, **F16)


class Knobs(fake.Knobs):
    pass


@pytest.fixture
def calls(monkeypatch):
    Knobs.lse_base, Knobs.last_page_off = 2.0, 0
    recorded: list = []
    fake.install(monkeypatch, fake.make_flashinfer(recorded, Knobs))
    return recorded


def graded(backend, case):
    t = materialize(case)
    out = backend.run(case, t)
    return out, grade(case, t, out, family=backend.family)


def test_paged_metadata_is_the_block_table_in_csr():
    t = materialize(PAGED)
    cache = paged_kv(PAGED, t.k, t.v)
    indptr, indices, last = fic.paged_metadata(cache)
    assert indptr.tolist() == [0, 3, 4, 5] and last.tolist() == [5, 16, 3]
    assert indices.tolist() == cache.page_indices(0) + cache.page_indices(1) + cache.page_indices(2)


@pytest.mark.parametrize("spelling, layout", [("", "NHD"), ("hnd", "HND")])
def test_paged_prefill_plans_the_cache_and_passes_grading(calls, spelling, layout):
    case = PAGED.replace(spelling=spelling)
    backend = fia.PagedPrefill("cpu")
    out, verdict = graded(backend, case)
    call = calls[-1]
    assert (call["kv_layout"], call["backend"], call["causal"], call["window_left"]) == (layout, "fa2", True, -1)
    assert call["qo_indptr"] == [0, 5, 7, 8] and call["last"] == [5, 16, 3] and call["page_size"] == 16
    assert call["sm_scale"] == pytest.approx(1 / math.sqrt(64)) and call["logits_soft_cap"] is None
    assert verdict.status == V.PASS, verdict.message
    assert out.ran == f"BatchPrefillWithPagedKVCacheWrapper(kv_layout={layout}, backend=fa2)"


TRANSLATIONS = [  # (case, causal, window_left): bottom-right bands, a top-left band shifted by skv - sq
    (Case(sq=4, skv=9, causal=True, alignment="bottom_right", **F16), True, -1),
    (Case(sq=4, skv=9, window=(3, 0), alignment="bottom_right", **F16), True, 3),
    (Case(sq=4, skv=9, window=(2, None), alignment="bottom_right", **F16), False, 2),
    (Case(sq=9, skv=9, causal=True, **F16), True, -1),
    (Case(sq=4, skv=9, window=(1, 5), **F16), True, 6),   # top-left (1, 5) is bottom-right (6, 0)
]


@pytest.mark.parametrize("case, causal, window_left", TRANSLATIONS)
@pytest.mark.parametrize("name", ["flashinfer-single-prefill", "flashinfer-ragged", "flashinfer-paged-prefill"])
def test_bands_translate_to_causal_and_window_left(calls, name, case, causal, window_left):
    backend = factories()[name]("cpu")
    if backend.paged:
        case = case.replace(page_size=3)
    assert backend.unsupported(case) is None, backend.unsupported(case)
    _, verdict = graded(backend, case.replace(softcap=5.0, scale=0.2))
    assert (calls[-1]["causal"], calls[-1]["window_left"], calls[-1]["logits_soft_cap"]) == (causal, window_left, 5.0)
    assert calls[-1]["sm_scale"] == 0.2
    assert verdict.status == V.PASS, verdict.message


DECODES = [
    ("flashinfer-paged-decode", PAGED.replace(sq=1, seqlens_q=(1, 0, 1), causal=False, window=(4, None))),
    ("flashinfer-paged-decode", PAGED.replace(sq=1, seqlens_q=None, page_size=1, spelling="hnd")),
    ("flashinfer-single-decode", Case(sq=1, skv=20, h=4, hk=1, alignment="bottom_right", spelling="hnd", **F16)),
    ("flashinfer-single-decode", Case(sq=1, skv=20, window=(2, 0), alignment="bottom_right", **F16)),
]


@pytest.mark.parametrize("name, case", DECODES)
def test_decode_entry_points_pass_grading(calls, name, case):
    backend = factories()[name]("cpu")
    assert backend.unsupported(case) is None, backend.unsupported(case)
    out, verdict = graded(backend, case)
    assert verdict.status == V.PASS, verdict.message
    assert "causal" not in calls[-1] and calls[-1]["window_left"] == (-1 if case.left is None else case.left)


def test_the_lse_comes_back_from_base_2(calls):
    """Control: a fake returning a natural-log LSE fails as LSE once the adapter multiplies by ln 2."""
    case = Case(b=2, sq=3, skv=7, page_size=2, **F16)
    backend = fia.PagedPrefill("cpu")
    for base, status in ((2.0, V.PASS), (math.e, V.FAIL)):
        Knobs.lse_base = base
        verdict = graded(backend, case)[1]
        assert verdict.status == status and (status == V.PASS or verdict.diagnosis == V.LSE), verdict.label


def test_a_read_past_the_last_page_is_caught(calls):
    """Control: the fake reading kv_last_page_len + 1 keys reads a garbage slot (or the next pool page)."""
    case = PAGED.replace(causal=False, alignment="top_left")
    assert graded(fia.PagedPrefill("cpu"), case)[1].status == V.PASS
    Knobs.last_page_off = 1
    assert graded(fia.PagedPrefill("cpu"), case)[1].status == V.FAIL


@pytest.mark.parametrize("name, case, reason", [
    ("flashinfer-paged-prefill", PAGED.replace(dtype="float32"), "dtype float32"),
    ("flashinfer-paged-prefill", PAGED.replace(d_qk=32, d_v=32), "head dim 32"),
    ("flashinfer-paged-prefill", PAGED.replace(d_v=128), "one head_dim"),
    ("flashinfer-paged-prefill", PAGED.replace(alibi_slopes=(0.5,) * 4), "ALiBi"),
    ("flashinfer-paged-prefill", PAGED.replace(softmax="learnable"), "sinks"),
    ("flashinfer-paged-prefill", PAGED.replace(mask_density=0.5), "custom_mask"),
    ("flashinfer-paged-prefill", PAGED.replace(causal=False, window=(2, 3)), "right bound 3"),
    ("flashinfer-paged-prefill", PAGED.replace(seqlens_kv=(37, 0, 3)), "kv_last_page_len"),
    ("flashinfer-paged-prefill", PAGED.replace(page_size=None), "paged KV cache"),
    ("flashinfer-ragged", PAGED, "not a paged cache"),
    ("flashinfer-ragged", PAGED.replace(page_size=None, spelling="hnd"), "NHD only"),
    ("flashinfer-paged-decode", PAGED, "one query per sequence"),
    ("flashinfer-single-prefill", PAGED.replace(page_size=None), "one request"),
    ("flashinfer-single-prefill", Case(sq=4, skv=4, spelling="neg", **F16), "spelling='neg'"),
    ("flashinfer-single-prefill", Case(sq=4, skv=9, causal=True, b=1, **F16), "aligns bands bottom-right"),
])
def test_capability_refusals(name, case, reason):
    refused = factories()[name]("cpu").unsupported(case)
    assert refused is not None and reason in refused, refused


def test_availability_names_the_install_and_the_offline_cubin_backends():
    assert "pip install flashinfer-python==0.7.2" in fia.PagedPrefill("cuda").available()
    assert "cannot work offline" in fia.PagedDecode("cuda", kernel_backend="trtllm-gen").available()
    assert fic.cubin_refusal("fa2") is None


def test_decode_backends_draw_one_query_per_sequence_and_paged_ones_only_paged_cases():
    seen = {name: set() for name in ("flashinfer-paged-decode", "flashinfer-paged-prefill", "flashinfer-ragged")}
    for name in seen:
        backend = factories()[name]("cpu")

        @settings(max_examples=60, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=cases_for(backend, Space(max_len=48)))
        def check(case):
            seen[name].add((case.sq == 1, case.paged, backend.unsupported(case) is None))
            assert case.sq <= 48 and case.skv <= 48          # the harness's space bounds the backend's own strategy

        check()
    assert {(sq1, paged) for sq1, paged, _ in seen["flashinfer-paged-decode"]} == {(True, True)}
    assert {paged for _, paged, _ in seen["flashinfer-paged-prefill"]} == {True}
    assert {paged for _, paged, _ in seen["flashinfer-ragged"]} == {False}
    assert all(any(ok for *_, ok in s) for s in seen.values()), seen


@pytest.mark.parametrize("name", ["flashinfer-paged-prefill", "flashinfer-paged-decode"])
def test_fuzzing_through_a_correct_fake_finds_nothing(calls, name):
    tally, findings = fuzz(factories()[name]("cpu"), space=Space(max_len=48, max_heads=4),
                           settings=profile("ci", max_examples=80))
    assert not findings, [f"{f.verdict.label} {f.verdict.message[:200]} {f.case!r}" for f in findings]
    assert tally.labels["PASS"] >= 40, tally.to_dict()


# -- standalone repro scripts -------------------------------------------------------------------------------------
REPRO_CASES = {
    "flashinfer-paged-prefill": PAGED.replace(spelling="hnd", shared_prefix_pages=1, seqlens_kv=(37, 16, 20)),
    "flashinfer-paged-decode": PAGED.replace(sq=1, seqlens_q=None, causal=False, page_size=3, window=(5, None)),
    "flashinfer-ragged": PAGED.replace(page_size=None, softcap=4.0),
    "flashinfer-single-prefill": Case(sq=6, skv=9, h=2, causal=True, alignment="bottom_right", spelling="hnd", **F16),
    "flashinfer-single-decode": Case(sq=1, skv=9, h=2, alignment="bottom_right", **F16),
}


@pytest.mark.parametrize("name", sorted(REPRO_CASES))
def test_the_repro_script_makes_the_adapters_call_and_can_fail(tmp_path, calls, name):
    from tests.test_repro_scripts import assert_standalone_and_able_to_fail, comparable, write
    backend, case = factories()[name]("cpu"), REPRO_CASES[name]
    assert backend.unsupported(case) is None, backend.unsupported(case)
    assert backend.repro_source(case) is not None
    backend.run(case, materialize(case))
    script_calls = assert_standalone_and_able_to_fail(write(tmp_path, name, case), fake="flashinfer")
    assert [json.loads(comparable(c)) for c in calls] == script_calls
