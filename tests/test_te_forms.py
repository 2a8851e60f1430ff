"""TransformerEngine's argument forms beyond its mask-type / window spellings (fuzz/backends/te/adapter.py,
applicable_spellings): window_size (-1, -1), padding as boolean attention_mask tensors on full-length sequences, the
mask type's comma and reversed strings, thd without max_seqlen. Against the fake TE on CPU: each form's arguments,
a fake mishandling one form caught under that spelling and not under the default one, and the repro script's call."""

from __future__ import annotations

import json

import pytest

from attnfuzz.backends.te import adapter as te_adapter
from attnfuzz.backends.te import selection as sel
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.fakes.transformer_engine import FakeTE

BF16 = dict(dtype="bfloat16")
CAUSAL = Case(sq=8, skv=8, h=2, causal=True, **BF16)
FULL = Case(sq=6, skv=9, h=2, **BF16)
THD = Case(b=3, sq=9, skv=11, h=2, seqlens_q=(9, 1, 4), seqlens_kv=(11, 3, 6), layout="thd", causal=True,
           alignment="bottom_right", **BF16)
PADDED_CAUSAL = Case(b=2, sq=6, skv=6, h=2, seqlens_q=(6, 2), seqlens_kv=(6, 2), causal=True, **BF16)


def verdict(name, case):
    adapter = te_adapter.BACKENDS[name]("cpu")
    assert adapter.unsupported(case) is None, adapter.unsupported(case)
    t = materialize(case)
    return grade(case, t, adapter.run(case, t), family=adapter.family)


@pytest.mark.parametrize("case, spelling, init, forward", [
    (CAUSAL, "unbounded-window", {"attn_mask_type": "causal", "window_size": (-1, -1)}, {}),
    (FULL, "unbounded-window", {"attn_mask_type": "no_mask", "window_size": (-1, -1)}, {}),
    (CAUSAL, "attention_mask", {"attn_mask_type": "padding_causal"}, {"cu_seqlens_q": None}),
    (PADDED_CAUSAL, "comma-mask-type", {"attn_mask_type": "padding,causal"}, {}),
    (PADDED_CAUSAL, "causal-padding", {"attn_mask_type": "causal,padding"}, {}),
    (THD, "comma-mask-type", {"attn_mask_type": "padding,causal_bottom_right"}, {}),
    (THD, "no-max-seqlen", {"attn_mask_type": "padding_causal_bottom_right"},
     {"max_seqlen_q": None, "max_seqlen_kv": None}),
    (CAUSAL.replace(alignment="bottom_right", sq=6), "comma-mask-type", {"attn_mask_type": "causal,bottom_right"}, {}),
], ids=lambda x: x if isinstance(x, str) else "")
def test_each_form_passes_its_arguments_and_grades_clean(monkeypatch, case, spelling, init, forward):
    fake = FakeTE().install(monkeypatch)
    case = case.replace(spelling=spelling)
    assert spelling in te_adapter.applicable_spellings(case, sel.UNFUSED)
    assert verdict("te-unfused", case).status == V.PASS
    assert {k: fake.inits[-1][k] for k in init} == init
    assert {k: fake.forwards[-1][k] for k in forward} == forward
    if spelling == "attention_mask":
        assert not fake.forwards[-1]["attention_mask"].any()     # full-length sequences: nothing masked out


def test_forms_are_offered_only_where_they_mean_the_case():
    def offered(case):
        return te_adapter.applicable_spellings(case, sel.UNFUSED)
    assert "unbounded-window" not in offered(CAUSAL.replace(window=(3, None)))     # (-1, -1) would drop the left bound
    assert "unbounded-window" not in offered(FULL.replace(window=(None, 2)))      # TE refuses a lone -1
    assert "comma-mask-type" not in offered(CAUSAL) and "causal-padding" not in offered(THD)
    assert "no-max-seqlen" not in offered(PADDED_CAUSAL)       # bshd: TE reads max_seqlen off the shapes anyway
    assert "attention_mask" not in offered(THD)


PLANTS = [  # (knob, case, the spelling that exposes it)
    ("mask_type_exact", PADDED_CAUSAL, "comma-mask-type"),
    ("mask_type_exact", PADDED_CAUSAL, "causal-padding"),
    ("causal_unbounded_window", CAUSAL, "unbounded-window"),
    ("inferred_max_seqlen", THD, "no-max-seqlen"),
]


@pytest.mark.parametrize("knob, case, spelling", PLANTS, ids=[f"{k}-{s}" for k, _, s in PLANTS])
@pytest.mark.parametrize("name", ["te-unfused", "te-fused"])
def test_a_fake_mishandling_one_form_is_caught_under_that_spelling_only(monkeypatch, knob, case, spelling, name):
    """Negative control: the correct fake passes the form; the planted one fails it and passes the default one."""
    FakeTE().install(monkeypatch)
    assert verdict(name, case.replace(spelling=spelling)).status == V.PASS
    FakeTE(**{knob: True}).install(monkeypatch)
    assert verdict(name, case.replace(spelling=spelling)).status == V.FAIL
    assert verdict(name, case).status == V.PASS


@pytest.mark.parametrize("name, case", [
    ("te-unfused", FULL.replace(layout="sbhd", spelling="attention_mask")),
    ("te-fused", THD.replace(spelling="no-max-seqlen")),
    ("te-unfused", PADDED_CAUSAL.replace(spelling="causal-padding")),
    ("te-fused", CAUSAL.replace(spelling="unbounded-window")),
], ids=lambda x: x if isinstance(x, str) else x.spelling)
def test_the_repro_script_makes_the_spelled_call(tmp_path, monkeypatch, name, case):
    from tests.test_repro_scripts import assert_standalone_and_able_to_fail, comparable, write
    fake = FakeTE().install(monkeypatch)
    adapter = te_adapter.BACKENDS[name]("cpu")
    assert adapter.unsupported(case) is None, adapter.unsupported(case)
    adapter.run(case, materialize(case))
    script_calls = assert_standalone_and_able_to_fail(write(tmp_path, name, case), fake="te")
    assert [json.loads(comparable(c)) for c in fake.forwards] == script_calls["forwards"]
