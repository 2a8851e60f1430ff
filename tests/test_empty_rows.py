"""EMPTY_ROWS: one name for a kernel wrong on the rows that see no key, whatever the wrong value is, and the other
rows' own diagnosis (saying the empty rows are wrong too) where those fail as well."""

from __future__ import annotations

import pytest

from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.broken import Correct, DroppedCausal, NanOnEmptyRows
from tests.empty_rows_kernels import MeanOnEmptyRowsAndScale, NanOnEmptyRowsAndNanElsewhere

TOO = "the rows that see no key are wrong too"
# rows 0-2 see no key (a bottom-right causal band, sq > skv); sequence 1 of the padded batch has no key at all
CASES = [Case(sq=5, skv=2, d_qk=16, d_v=8, causal=True, alignment="bottom_right", dtype="float16"),
         Case(b=2, sq=3, skv=3, d_qk=16, d_v=8, seqlens_kv=(3, 0)),
         Case(b=2, sq=4, skv=4, d_qk=16, d_v=8, seqlens_kv=(4, 0), values="probe", dtype="bfloat16")]


def _verdict(kernel, case):
    t = materialize(case)
    return grade(case, t, kernel.run(case, t))


@pytest.mark.parametrize("case", CASES, ids=["band", "empty_kv_sequence", "probe"])
def test_nan_on_the_rows_that_see_no_key_alone_is_empty_rows(case):
    """NaN on those rows and nowhere else: EMPTY_ROWS, not NONFINITE (the same bug as a non-zero row there)."""
    verdict = _verdict(NanOnEmptyRows(), case)
    assert verdict.label == "FAIL:EMPTY_ROWS", verdict
    assert "got=nan" in verdict.message and verdict.worst.index[:2] in {(0, 0), (1, 0)}, verdict
    assert _verdict(Correct(), case).status == V.PASS   # the control


@pytest.mark.parametrize("case", CASES[:2], ids=["band", "empty_kv_sequence"])
def test_a_second_bug_on_the_rows_that_see_keys_is_named_and_the_empty_rows_said(case):
    """mean(V) on the empty rows and the softmax scaled by 1/sqrt(d_v): the other rows' diagnosis (SCALE), graded
    without the empty rows, with the empty rows named in the message."""
    verdict = _verdict(MeanOnEmptyRowsAndScale(), case)
    assert verdict.label == "FAIL:SCALE" and TOO in verdict.message, verdict
    nan = _verdict(NanOnEmptyRowsAndNanElsewhere(), case)
    assert nan.label == "FAIL:NONFINITE" and TOO in nan.message and "got nan" in nan.message, nan
    assert nan.worst.index[1] == case.sq - 1, nan       # the NaN the other rows hold, not the empty rows'


def test_rows_that_see_keys_wrong_with_the_empty_rows_right_do_not_mention_them():
    """The control: the same kernels on a case where every row sees a key say nothing of empty rows."""
    case = Case(sq=5, skv=5, d_qk=16, d_v=8, causal=True, dtype="float16")
    scale, nan = _verdict(MeanOnEmptyRowsAndScale(), case), _verdict(NanOnEmptyRowsAndNanElsewhere(), case)
    assert scale.label == "FAIL:SCALE" and nan.label == "FAIL:NONFINITE", (scale, nan)
    assert TOO not in scale.message and TOO not in nan.message


def test_a_dropped_mask_wrong_on_empty_rows_alone_is_empty_rows_and_lists_the_alternatives():
    """bottom-right sq = 2, skv = 1: only row 0 (no key) is wrong; the alternatives the output matches are in `also`.
    With more rows the rows that see keys fail too, and the band's alternative names it."""
    one = _verdict(DroppedCausal(), Case(sq=2, skv=1, d_qk=8, d_v=8, causal=True, alignment="bottom_right",
                                         dtype="float16"))
    assert one.label == "FAIL:EMPTY_ROWS" and V.MASK_IGNORED in one.also, one
    more = _verdict(DroppedCausal(), Case(sq=147, skv=129, d_qk=8, d_v=8, causal=True, alignment="bottom_right",
                                          dtype="float16"))
    assert more.label == "FAIL:MASK_IGNORED" and TOO in more.message, more
