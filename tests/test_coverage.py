"""Coverage cells: each axis classes hand-made cases as its docstring says, and the counts add up."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings

from attnfuzz.report.coverage import AXES, AXIS_NAMES, SPACE_SIZE, Coverage, cell_of
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.space import Space

PAD = dict(b=2, seqlens_q=(16, 9), seqlens_kv=(16, 12))

# (axis, Case keywords, expected value); every value of every axis appears at least once
EXAMPLES = [
    ("mask", {}, "none"),
    ("mask", dict(causal=True), "causal"),
    ("mask", PAD, "padding"),
    ("mask", dict(PAD, causal=True), "padding_causal"),
    ("mask", dict(mask_density=0.0), "bool_empty"),
    ("mask", dict(mask_density=0.2, causal=True), "bool_sparse"),
    ("mask", dict(mask_density=0.5), "bool_dense"),
    ("mask", dict(mask_density=1.0), "bool_full"),
    ("alignment", dict(sq=4, skv=8, causal=True), "top_left"),
    ("alignment", dict(sq=4, skv=8, causal=True, alignment="bottom_right"), "bottom_right"),
    ("alignment", dict(sq=8, skv=8, causal=True, alignment="bottom_right"), "n/a"),         # offset 0
    ("alignment", dict(sq=4, skv=8, alignment="bottom_right"), "n/a"),                       # nothing reads it
    ("alignment", dict(sq=4, skv=8, h=2, hk=2, alibi_slopes=(0.5, 0.25), alignment="bottom_right"), "bottom_right"),
    ("alignment", dict(PAD, causal=True, alignment="bottom_right"), "bottom_right"),         # ragged sequences
    ("window", {}, "none"),
    ("window", dict(causal=True, window=(None, 0)), "none"),                                 # causal's own bound
    ("window", dict(causal=True, window=(3, 0)), "left"),
    ("window", dict(window=(3, None)), "left"),
    ("window", dict(window=(None, 3)), "right"),
    ("window", dict(window=(3, 5)), "both"),
    ("window", dict(window=(0, 0)), "zero"),
    ("window", dict(window=(None, 0)), "zero"),
    ("window", dict(window=(16, 2)), "beyond"),                                               # 16 >= max(sq, skv)
    ("window", dict(sq=8, skv=20, window=(15, 2)), "both"),
    ("layout", dict(PAD, layout="thd"), "thd"),
    ("layout", dict(layout="sbhd"), "sbhd"),
    ("layout", {}, "bshd"),
    ("dtype", dict(dtype="bfloat16"), "bfloat16"),
    ("dtype", dict(dtype="float16"), "float16"),
    ("dtype", dict(dtype="float64"), "float64"),
    ("dtype", {}, "float32"),
    ("heads", dict(h=4, hk=4), "MHA"),
    ("heads", dict(h=4, hk=2), "GQA"),
    ("heads", dict(h=4, hk=1), "MQA"),
    ("heads", dict(h=1, hk=1), "MHA"),
    ("length", dict(sq=1, skv=1), "sq=1/eq"),
    ("length", dict(sq=1, skv=300), "sq=1/ne"),
    ("length", dict(sq=16, skv=16), "tiny/eq"),
    ("length", dict(sq=3, skv=16), "tiny/ne"),
    ("length", dict(sq=63, skv=63), "tile_edge/eq"),
    ("length", dict(sq=100, skv=129), "tile_edge/ne"),
    ("length", dict(b=2, sq=100, skv=100, seqlens_q=(65, 3), seqlens_kv=(65, 3)), "tile_edge/eq"),  # per sequence
    ("length", dict(sq=62, skv=62), "small/eq"),
    ("length", dict(sq=17, skv=30), "small/ne"),
    ("length", dict(sq=512, skv=512), "tile_edge/eq"),
    ("length", dict(sq=600, skv=600), "long/eq"),
    ("length", dict(sq=1000, skv=700), "long/ne"),
    ("length", dict(PAD), "tiny/ne"),                                                        # 9 queries, 12 keys
    ("kv", {}, "contiguous"),
    ("kv", dict(skv=32, page_size=16), "paged"),
    ("kv", dict(PAD, page_size=4), "paged"),                                                 # 16 and 12 keys
    ("kv", dict(PAD, page_size=5), "paged_tail"),
    ("kv", dict(PAD, page_size=4, shared_prefix_pages=2), "paged_shared"),
    ("storage", {}, "plain"),
    ("storage", dict(storage=("plain", "offset", "plain")), "offset"),
    ("storage", dict(storage=("offset", "plain", "padded_rows")), "padded_rows"),
    ("storage", dict(storage=("strided", "offset", "padded_rows")), "strided"),
]


@pytest.mark.parametrize("axis,kwargs,expected", EXAMPLES, ids=[f"{a}-{e}-{i}" for i, (a, _, e) in
                                                                 enumerate(EXAMPLES)])
def test_axis_classes_a_hand_made_case(axis, kwargs, expected):
    cell = cell_of(Case(**kwargs))
    assert cell[AXIS_NAMES.index(axis)] == expected, (kwargs, dict(zip(AXIS_NAMES, cell)))


def test_every_axis_value_has_an_example():
    seen = {(axis, value) for axis, _, value in EXAMPLES}
    missing = [(a.name, v) for a in AXES for v in a.values if (a.name, v) not in seen]
    assert not missing


def test_space_size_is_the_product_of_the_axes():
    assert SPACE_SIZE == math.prod(len(a.values) for a in AXES) == 8 * 3 * 6 * 3 * 4 * 3 * 10 * 4 * 4


def test_a_case_dict_maps_to_the_cases_cell():
    case = Case(b=2, sq=65, skv=70, h=6, hk=2, causal=True, window=(4, 0), alignment="bottom_right",
                seqlens_q=(65, 1), seqlens_kv=(70, 2), layout="thd", dtype="bfloat16")
    assert cell_of(case.to_dict()) == cell_of(case) == (
        "padding_causal", "bottom_right", "left", "thd", "bfloat16", "GQA", "tile_edge/ne", "contiguous", "plain")


@settings(max_examples=150, deadline=None, derandomize=True)
@given(case=attention_cases(Space(max_len=300)))
def test_drawn_cases_fall_on_listed_values(case):
    for axis, value in zip(AXES, cell_of(case)):
        assert value in axis.values, (axis.name, value, case)


def test_counts_per_backend_and_cell():
    cov = Coverage()
    plain, causal, wide = Case(), Case(causal=True), Case(dtype="float64")
    for label in ("PASS", "PASS", "FAIL:TOLERANCE", "KNOWN:LSE"):
        cov.add("a", plain, label)
    cov.add("a", causal, "CRASH:RuntimeError")
    cov.add("a", wide, "UNSUPPORTED")
    cov.add("b", plain.to_dict(), "PASS")
    cov.add("b", causal, "HANG:Hang")
    cov.add("b", causal, "FLAKY:FAIL:ALL_ZERO")
    cells = cov.cell_counts("a")
    c = cells[cell_of(plain)]
    assert (c.cases, c.passed, c.failed, c.known, c.refused) == (4, 2, 1, 1, 0)
    assert cells[cell_of(causal)].failed == 1 and not cells[cell_of(wide)].covered
    assert cov.cell_counts("b")[cell_of(causal)].failed == 2
    assert dict(cov.tally("a")) == {"covered": 2, "failing": 2, "known": 1, "refused_only": 1}
    assert cov.summary("a") == f"cells 2/{SPACE_SIZE} covered (0.00%), 2 failing, 1 known, 1 refused only"
    assert cov.summary("b").startswith(f"cells 2/{SPACE_SIZE} covered") and "1 failing" in cov.summary("b")
    merged = cov.cell_counts()[cell_of(plain)]
    assert (merged.cases, merged.passed) == (5, 3)
    assert cov.backends() == ["a", "b"]


def test_marginals_add_up_to_the_cases():
    cov = Coverage()
    cases = [Case(), Case(causal=True), Case(causal=True, dtype="float16"), Case(sq=1, skv=9, h=4, hk=1)]
    for i, case in enumerate(cases):
        cov.add("a", case, "PASS" if i % 2 else "UNSUPPORTED")
    margins = cov.marginals("a")
    assert list(margins) == list(AXIS_NAMES)
    for axis in AXES:
        rows = margins[axis.name]
        assert [r.value for r in rows] == list(axis.values)
        assert sum(r.counts.cases for r in rows) == len(cases)
        assert all(r.cells_total == SPACE_SIZE // len(axis.values) for r in rows)
    mask = {r.value: r for r in margins["mask"]}
    assert (mask["causal"].counts.cases, mask["causal"].counts.passed, mask["causal"].cells_covered) == (2, 1, 1)
    assert (mask["none"].counts.refused, mask["none"].cells_covered) == (1, 1)
    assert {r.value: r.counts.cases for r in margins["heads"]} == {"MHA": 3, "GQA": 0, "MQA": 1}


def test_the_drawn_distribution_counts_classes_and_repeats():
    cov = Coverage()
    decode, tall = Case(sq=1, skv=600, d_qk=192, d_v=128), Case(sq=1088, skv=64, causal=True)
    for case in (decode, decode.to_dict(), tall):
        cov.add("a", case, "PASS")
    drawn = cov.distribution("a")
    assert (drawn.cases, drawn.repeats) == (3, 1)
    assert drawn.counts["shape"] == {"decode": 2, "tall": 1}
    assert drawn.counts["head dim"] == {"129-192+split": 2, "<=64": 1}
    assert drawn.counts["skv residue"] == {"other": 2, "%128=64": 1}
    assert drawn.counts["causal x length"] == {"non-causal/>=300": 2, "causal/>=300": 1}
    assert dict(drawn.shares()["sq"]) == {"1": 2 / 3, "1025-2048": 1 / 3}
    assert cov.distribution("b").cases == 0
