"""The case features (strategies/features.py), their witnesses, and the combination coverage counted over them
(fuzz/report/combos.py)."""

from __future__ import annotations

import itertools
import random

import pytest

from attnfuzz.report.combos import Combos, Feasible, describe
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.features import FEATURES, features, witness_case
from attnfuzz.strategies.space import Space, draws


def test_the_band_is_what_the_rows_see_whatever_flags_spell_it():
    causal = Case(sq=8, skv=8, causal=True)
    as_window = Case(sq=8, skv=8, window=(None, 0))
    assert features(causal)["band"] == features(as_window)["band"] == "causal"
    offset = Case(sq=9, skv=5, window=(None, 0), alignment="bottom_right")
    assert features(offset)["band"] == "causal_bottom_right"
    assert features(offset.replace(alignment="top_left"))["band"] == "causal"
    assert features(Case(window=(3, None)))["band"] == "window"
    assert features(Case())["band"] == "none"


@pytest.mark.parametrize("n, cls", [(1, "1"), (2, "small"), (62, "small"), (63, "edge"), (64, "edge"), (65, "edge"),
                                    (66, "small"), (129, "edge"), (160, "small"), (192, "long_edge"),
                                    (193, "long_edge"), (194, "long"), (16383, "long_edge")])
def test_lengths_are_classed_by_tile_edge(n, cls):
    assert features(Case(sq=n, skv=n))["len_kv"] == cls


def test_decode_is_few_queries_over_many_keys():
    assert features(Case(sq=16, skv=512))["len_q"] == "decode"
    assert features(Case(sq=17, skv=512))["len_q"] == "small"
    assert features(Case(sq=1, skv=511))["len_q"] == "1"


@pytest.mark.parametrize("d_qk, d_v, cls", [(16, 16, "small"), (64, 64, "64"), (96, 128, "65-128"),
                                            (72, 72, "65-128_off_32"), (128, 80, "65-128_off_32"),
                                            (64, 512, "over_128")])
def test_head_dim_classes(d_qk, d_v, cls):
    assert features(Case(d_qk=d_qk, d_v=d_v))["head_dim"] == cls


def test_every_class_has_a_witness_alone():
    for f in FEATURES:
        for value in f.values:
            case = witness_case({f.name: value})
            assert case is not None and f.of(case) == value, (f.name, value)


def test_witnesses_refuse_what_the_case_language_forbids():
    assert witness_case({"sequences": "paged", "gradients": "on"}) is None        # paged caches are forward only
    assert witness_case({"len_q": "decode", "len_kv": "small"}) is None           # decode needs 512 keys or more
    assert witness_case({"layout": "sbhd", "buffer": "offset"}) is None           # drawn buffers are bshd only
    both = witness_case({"band": "causal_bottom_right", "len_q": "long_edge", "gradients": "on"})
    assert both is not None and features(both)["band"] == "causal_bottom_right"


def test_a_space_without_a_feature_draws_no_witness_of_it():
    case = witness_case({"gradients": "on"})
    assert draws(Space(), case) and not draws(Space(grads=False), case)
    assert not draws(Space(), witness_case({"dtype": "float64"}))                 # not among the default dtypes


def _naive(cases, t, feasible_pairs):
    """t-way combinations covered, counted the plain way: a set of (features, classes) per case."""
    seen = set()
    for case in cases:
        f = features(case)
        for names in itertools.combinations([x.name for x in FEATURES], t):
            key = tuple((n, f[n]) for n in names)
            if feasible_pairs(dict(key)):
                seen.add(key)
    return len(seen)


def test_the_counted_coverage_is_the_naive_count():
    rng = random.Random(3)
    cases = [Case(sq=rng.choice([1, 8, 64, 200]), skv=rng.choice([1, 8, 65, 300, 600]), causal=rng.random() < .5,
                  grads=rng.random() < .3, dtype=rng.choice(["float16", "bfloat16"]),
                  values=rng.choice(["gaussian", "probe", "ties"]), mask_density=rng.choice([None, 0.5]),
                  d_qk=rng.choice([16, 64, 72, 256]), d_v=64) for _ in range(40)]
    feasible = Feasible(Space())
    combos = Combos()
    for case in cases:
        combos.add(case)
    report = combos.report(feasible, ways=(2, 3))

    def is_feasible(classes):
        names = tuple(sorted(FEATURES.index(next(f for f in FEATURES if f.name == n)) for n in classes))
        table = feasible.table(names)
        code = 0
        for i in names:
            code = code * len(FEATURES[i].values) + FEATURES[i].values.index(classes[FEATURES[i].name])
        return bool(table[code])

    assert report["2-way"]["covered"] == _naive(cases, 2, is_feasible)
    assert report["3-way"]["covered"] == _naive(cases, 3, is_feasible)
    assert report["2-way"]["curve"][-1] == [40, report["2-way"]["covered"]]
    assert 0 < report["3-way"]["covered"] <= report["3-way"]["feasible"]
    assert "2-way" in describe(report)


def test_a_backends_refusals_leave_the_denominator():
    every = Feasible(Space())
    no_grads = Feasible(Space(), unsupported=lambda c: "no backward" if c.grads else None)
    axes = (0, [f.name for f in FEATURES].index("gradients"))
    assert int(no_grads.table(axes).sum()) == int(every.table(axes).sum()) // 2


def test_four_way_feasibility_needs_every_three_way_part():
    feasible = Feasible(Space())
    names = [f.name for f in FEATURES]
    quad = tuple(sorted(names.index(n) for n in ("sequences", "gradients", "dtype", "softmax")))
    table = feasible.table(quad)
    sizes = [len(FEATURES[i].values) for i in quad]
    grid = table.reshape(sizes)
    paged, on = FEATURES[quad[0]].values.index("paged"), FEATURES[quad[1]].values.index("on")
    assert not grid[paged, on].any() and grid[0, on].any()


def no_causal_gradients(q, k, v, *, causal, window, bottom_right, scale):
    """A correct plain kernel that refuses windows outright and causal cases with gradients in combination."""
    from tests.misbehaving import _plain
    return _plain(q, k, v, scale, causal, bottom_right)


no_causal_gradients.supports = lambda case: (case.window == (None, None) and not (case.causal and case.grads)
                                             and not case.padded and case.mask_density is None
                                             and case.alibi_slopes is None and case.softmax == "vanilla"
                                             and case.softcap is None) or "a plain kernel"


def test_run_json_counts_graded_cases_only_and_leaves_refused_combinations_out(tmp_path, capsys):
    import json
    from attnfuzz.cli import main
    spec = "tests.test_features:no_causal_gradients"
    code = main(["run", "--backend", spec, "--max-examples", "80", "--max-len", "24", "--profile", "ci",
                 "--corpus", str(tmp_path / "c"), "--json"])
    summary = json.loads(capsys.readouterr().out)[spec]
    tally, combos = summary["tally"], summary["combinations"]
    assert code == 0, tally
    refused = sum(tally["unsupported"].values())
    assert refused > 0, tally                         # the combination the kernel refuses was drawn
    assert combos["cases"] == tally["labels"]["PASS"] == tally["examples"] - refused
    # causal with gradients is refused, so it is not a feasible pair: every feasible pair is one the kernel takes
    names = [f.name for f in FEATURES]
    pair = tuple(sorted((names.index("band"), names.index("gradients"))))
    from attnfuzz.backends import get
    from attnfuzz.report.combos import feasible_of
    table = feasible_of(get(spec, "cpu"), Space.for_device("cpu", 24)).table(pair).reshape(4, 2)
    assert not table[FEATURES[pair[0]].values.index("causal"), 1] and table[0, 1] and table[1, 0]
