"""flex's ROWS_GUARANTEED_SAFE asks more than its docstring: a row must see a key at the start of the first key block
the compiled kernel runs for it (fuzz/backends/flex/first_tile.py). The condition, worked out by hand on band
shapes, and the known-bug record that states it: it takes the NaN of a case that meets it and no other."""

from __future__ import annotations

from attnfuzz.backends.flex.first_tile import first_tile_unseen
from attnfuzz.oracles import verdict as V
from attnfuzz.store.known import when_fields
from attnfuzz.strategies.case import Case
from tests.shipped import taken

ENTRY = "flex-compiled-FAIL-NONFINITE-be100aded2d7"
SAFE = "rows_safe"
# the entry's case: thd, sequence 0 has no query, sequence 1's 128 queries see its 3 keys at packed 115..117
FOUND = Case(b=2, sq=128, skv=125, h=4, hk=4, d_qk=64, d_v=64, dtype="float32", seqlens_q=(0, 128),
             seqlens_kv=(115, 3), layout="thd", spelling=SAFE)


def test_rows_that_see_keys_but_none_at_their_first_partial_block_are_found():
    assert first_tile_unseen(FOUND)
    assert first_tile_unseen(Case(sq=256, skv=256, window=(8, 0), spelling=SAFE))      # a sliding window
    # bottom-right causal, 128 queries over 255 keys: key block 0 is full for every row, block 1 partial, and row 0
    # sees keys 0..127 only, none of block 1 (key 128), which the kernel runs first
    assert first_tile_unseen(Case(sq=128, skv=255, causal=True, alignment="bottom_right", spelling=SAFE))


def test_rows_that_see_the_start_of_their_first_partial_block_are_not():
    assert not first_tile_unseen(Case(sq=256, skv=256, spelling=SAFE))                          # every block full
    assert not first_tile_unseen(Case(sq=300, skv=300, causal=True, spelling=SAFE))             # the diagonal block
    # 100 queries over 300 keys, bottom-right: row 0 sees 0..200, so key 128, block 1's start, is seen by every row
    assert not first_tile_unseen(Case(sq=100, skv=300, causal=True, alignment="bottom_right", spelling=SAFE))
    # one packed sequence of 100 rows: the block's 28 rows past the call are masked but not rows of the call
    assert not first_tile_unseen(Case(b=1, sq=100, skv=100, seqlens_q=(100,), seqlens_kv=(100,), layout="thd",
                                      causal=True, spelling=SAFE))


def test_without_a_block_mask_every_tile_runs_from_key_0():
    bottom_right = Case(sq=128, skv=255, causal=True, alignment="bottom_right", spelling="score_mask+rows_safe")
    assert not first_tile_unseen(bottom_right)                                   # every row sees key 0
    assert first_tile_unseen(Case(sq=64, skv=64, window=(4, 0), spelling="score_mask+rows_safe"))


def test_the_trait_holds_under_the_rows_safe_spelling_only():
    assert when_fields(FOUND)["flex_rows_safe_first_tile_unseen"]
    assert not when_fields(FOUND.replace(spelling=""))["flex_rows_safe_first_tile_unseen"]


def test_the_record_takes_the_nan_of_its_condition_and_no_other():
    nan = V.Verdict(V.FAIL, "NONFINITE", "non-finite output, first at [1, 0, 0, 0]: nan")
    assert taken("flex-compiled", FOUND, nan) == ENTRY
    window = Case(sq=256, skv=256, window=(8, 0), spelling=SAFE)
    assert taken("flex-compiled", window, nan) == ENTRY
    # the same label and message where every row sees the start of its first partial block: another bug, NEW
    assert not taken("flex-compiled", Case(sq=300, skv=300, causal=True, spelling=SAFE), nan)
    assert not taken("flex-compiled", FOUND.replace(spelling=""), nan)
