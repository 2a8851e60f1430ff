"""bench/flex_first_tile.py without a GPU: its grid holds cases on both sides of the trait, and its check flags a NaN
the trait does not predict (a kernel that NaNs everywhere) and passes one that NaNs where the trait says."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

from attnfuzz.backends.flex.first_tile import first_tile_unseen

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("flex_first_tile", ROOT / "bench" / "flex_first_tile.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_the_grid_has_cases_on_both_sides_of_the_trait():
    unseen = Counter(first_tile_unseen(c) for c in bench.grid("float16"))
    assert unseen[True] >= 20 and unseen[False] >= 20, unseen


def test_a_nan_the_trait_does_not_predict_is_a_violation():
    cases = list(bench.grid("float16"))
    tally, violations = bench.check(cases, lambda case: True)          # NaN everywhere
    assert violations and tally[(False, True)] == len(violations)
    tally, violations = bench.check(cases, first_tile_unseen)           # NaN exactly where the trait says
    assert not violations and tally[(True, True)] and tally[(False, False)]
    tally, _ = bench.check(cases[:3], lambda case: None)                # refused: counted, not checked
    assert tally["refused"] == 3

