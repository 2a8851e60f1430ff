"""FlashInfer's argument forms (fuzz/backends/flashinfer/spelling.py) against the fake flashinfer on CPU: which entry
point lists which spelling, the arguments each spelling passes, a fake that mishandles one form caught under that
spelling and not under the default one, and repro scripts that make the adapter's call."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnfuzz.backends import factories
from attnfuzz.backends.flashinfer import spelling as fis
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.fakes import flashinfer as fake
from tests.test_backend_flashinfer import F16, PAGED

PLANTED = ("wide_window_empty", "packed_bitorder", "cap_zero_is_cap", "kv_tensor_swapped", "tensor_cores_gqa",
           "default_scale", "decode_lse_squeezed")


class Knobs(fake.Knobs):
    pass


@pytest.fixture
def calls(monkeypatch):
    for name in PLANTED:
        setattr(Knobs, name, getattr(fake.Knobs, name))
    recorded: list = []
    fake.install(monkeypatch, fake.make_flashinfer(recorded, Knobs))
    return recorded


def backend(name):
    return factories()[name]("cpu")


def verdict_of(name, case):
    t = materialize(case)
    b = backend(name)
    assert b.unsupported(case) is None, b.unsupported(case)
    return grade(case, t, b.run(case, t), family=b.family)


SINGLE = Case(sq=6, skv=9, h=4, hk=2, causal=True, alignment="bottom_right", **F16)
DECODE = PAGED.replace(sq=1, seqlens_q=None, causal=False, page_size=4)


def test_each_entry_point_lists_the_forms_its_api_takes():
    single = backend("flashinfer-single-prefill").spellings(SINGLE)
    assert single[0] == "" and {"hnd", "wide_window", "custom_mask", "packed_custom_mask", "default_scale",
                                 "softcap_zero", "no_lse"} <= set(single)
    assert not any("tensor_cores" in s or "kv_tensor" in s for s in single)
    assert "wide_window" not in backend("flashinfer-single-prefill").spellings(SINGLE.replace(window=(3, 0)))
    assert "default_scale" not in backend("flashinfer-single-prefill").spellings(SINGLE.replace(scale=0.3))
    assert "softcap_zero" not in backend("flashinfer-single-prefill").spellings(SINGLE.replace(softcap=3.0))
    ragged = backend("flashinfer-ragged").spellings(PAGED.replace(page_size=None))
    assert "custom_mask" in ragged and not any("packed" in s or "hnd" in s for s in ragged)   # b = 3
    assert "packed_custom_mask" in backend("flashinfer-ragged").spellings(SINGLE)          # one request
    paged = backend("flashinfer-paged-prefill").spellings(PAGED)
    assert {"kv_tensor", "hnd+kv_tensor+custom_mask"} <= set(paged)
    decode = backend("flashinfer-paged-decode").spellings(DECODE)
    assert {"tensor_cores", "hnd+kv_tensor+wide_window+no_lse+tensor_cores"} <= set(decode)
    assert not any("custom_mask" in s for s in decode)
    single_decode = backend("flashinfer-single-decode").spellings(DECODE.replace(b=1, seqlens_kv=None,
                                                                               page_size=None))
    assert {"return_lse", "tensor_cores"} <= set(single_decode) and "no_lse" not in single_decode
    assert len(set(paged)) == len(paged)


def test_packbits_little_matches_numpys_little_bitorder():
    bits = torch.rand(29, generator=torch.Generator().manual_seed(0)) < 0.5
    assert fis.packbits_little(bits).tolist() == np.packbits(bits.numpy(), bitorder="little").tolist()


FORMS = [  # (backend, case, spelling, what the recorded call holds)
    ("flashinfer-single-prefill", SINGLE, "wide_window", {"window_left": 9, "causal": True}),
    ("flashinfer-single-prefill", SINGLE, "default_scale+softcap_zero", {"sm_scale": None, "logits_soft_cap": 0.0}),
    ("flashinfer-single-prefill", SINGLE, "no_lse", {"return_lse": False}),
    ("flashinfer-single-prefill", SINGLE, "custom_mask", {"causal": False, "window_left": -1,
                                                          "packed_custom_mask": None}),
    ("flashinfer-ragged", PAGED.replace(page_size=None, window=(2, 0), causal=False), "custom_mask",
     {"causal": False, "window_left": -1, "packed_custom_mask": None}),
    ("flashinfer-paged-prefill", PAGED, "kv_tensor", {"kv_tensor": True}),
    ("flashinfer-paged-decode", DECODE, "hnd+no_lse+tensor_cores",
     {"use_tensor_cores": True, "return_lse": False, "kv_layout": "HND"}),
    ("flashinfer-single-decode", Case(sq=1, skv=20, h=4, hk=1, alignment="bottom_right", **F16), "return_lse",
     {"return_lse": True, "use_tensor_cores": False}),
]


@pytest.mark.parametrize("name, case, spelling, want", FORMS, ids=lambda x: x if isinstance(x, str) else "")
def test_each_form_passes_its_arguments_and_grades_clean(calls, name, case, spelling, want):
    verdict = verdict_of(name, case.replace(spelling=spelling))
    assert verdict.status == V.PASS, verdict.message
    assert {key: calls[-1][key] for key in want} == want


def test_a_custom_mask_holds_the_case_band_per_request(calls):
    """The flattened custom mask is request after request's [qo, kv] visibility, the packed one its bits."""
    case = PAGED.replace(page_size=None, b=2, seqlens_q=(5, 2), seqlens_kv=(7, 3), sq=5, skv=7,
                         spelling="custom_mask")
    verdict_of("flashinfer-ragged", case)
    mask = calls[-1]["custom_mask"]
    i, j = torch.arange(5)[:, None], torch.arange(7)[None]
    first = j <= i + 2                                         # bottom-right causal, skv - sq = 2
    second = torch.arange(3)[None] <= torch.arange(2)[:, None] + 1
    assert mask.tolist() == torch.cat([first.flatten(), second.flatten()]).tolist()


PLANTS = [  # (knob, value, backend, case, the spelling that exposes it)
    ("wide_window_empty", True, "flashinfer-single-prefill", SINGLE, "wide_window"),
    ("packed_bitorder", "big", "flashinfer-single-prefill", SINGLE, "packed_custom_mask"),
    ("cap_zero_is_cap", True, "flashinfer-paged-prefill", PAGED, "softcap_zero"),
    ("kv_tensor_swapped", True, "flashinfer-paged-prefill", PAGED, "kv_tensor"),
    ("tensor_cores_gqa", True, "flashinfer-paged-decode", DECODE, "tensor_cores"),
    ("default_scale", 1.0, "flashinfer-ragged", PAGED.replace(page_size=None), "default_scale"),
]


@pytest.mark.parametrize("knob, value, name, case, spelling", PLANTS, ids=[p[0] for p in PLANTS])
def test_a_fake_mishandling_one_form_is_caught_under_that_spelling_only(calls, knob, value, name, case, spelling):
    """Negative control: the correct fake passes the form; the planted one fails it and still passes the default
    spelling (and the custom mask, for the packed bit order), so the form is what finds it."""
    assert verdict_of(name, case.replace(spelling=spelling)).status == V.PASS
    setattr(Knobs, knob, value)
    assert verdict_of(name, case.replace(spelling=spelling)).status == V.FAIL
    assert verdict_of(name, case).status == V.PASS
    if spelling == "packed_custom_mask":
        assert verdict_of(name, case.replace(spelling="custom_mask")).status == V.PASS


def test_a_one_head_decode_lse_squeezed_to_0d_is_a_shape_failure_not_a_crash(calls):
    """FlashInfer 0.7.2.post1's single decode with use_tensor_cores squeezes its [h] LSE: 0-d for one head. The
    adapter hands that on for the grader to name (SHAPE), rather than failing in its own reshaping (an IndexError)."""
    one_head = Case(sq=1, skv=9, h=1, hk=1, spelling="return_lse+tensor_cores", **F16)
    assert verdict_of("flashinfer-single-decode", one_head).status == V.PASS
    Knobs.decode_lse_squeezed = True
    said = verdict_of("flashinfer-single-decode", one_head)
    assert said.label == "FAIL:SHAPE" and "lse has shape ()" in said.message, said
    assert verdict_of("flashinfer-single-decode", one_head.replace(h=2, hk=2)).status == V.PASS, "[h] squeezes to [h]"
    assert verdict_of("flashinfer-single-decode", one_head.replace(spelling="return_lse")).status == V.PASS


REPRO_CASES = [
    ("flashinfer-single-prefill", SINGLE.replace(spelling="hnd+packed_custom_mask+softcap_zero+no_lse")),
    ("flashinfer-ragged", PAGED.replace(page_size=None, spelling="custom_mask+default_scale")),
    ("flashinfer-paged-prefill", PAGED.replace(spelling="kv_tensor+wide_window+no_lse")),
    ("flashinfer-paged-prefill", PAGED.replace(b=1, seqlens_q=None, seqlens_kv=None, spelling="packed_custom_mask")),
    ("flashinfer-paged-decode", DECODE.replace(spelling="hnd+kv_tensor+tensor_cores")),
    ("flashinfer-single-decode", Case(sq=1, skv=9, h=4, hk=2, alignment="bottom_right",
                                      spelling="return_lse+tensor_cores", **F16)),
]


@pytest.mark.parametrize("name, case", REPRO_CASES, ids=[f"{n}-{c.spelling}" for n, c in REPRO_CASES])
def test_the_repro_script_makes_the_spelled_call(tmp_path, calls, name, case):
    from tests.test_repro_scripts import assert_standalone_and_able_to_fail, comparable, write
    b = backend(name)
    assert b.unsupported(case) is None, b.unsupported(case)
    b.run(case, materialize(case))
    script_calls = assert_standalone_and_able_to_fail(write(tmp_path, name, case), fake="flashinfer")
    assert [json.loads(comparable(c)) for c in calls] == script_calls
