"""The records of torch SDPA's GPU bugs that a 10-minute H100 campaign met under new faces: each takes the new face
of its bug and stays narrow, so a different bug with the same label and message comes out new."""

from __future__ import annotations

import pytest

from attnfuzz.oracles import verdict as V
from attnfuzz.store.known import TRAITS
from attnfuzz.strategies.case import Case
from tests.test_known_precise import _taken   # the shipped corpus's record that takes a failure, by id


def _fail(diagnosis, message="out: worst of 1 rows"):
    return V.Verdict(V.FAIL, diagnosis, message)


@pytest.mark.parametrize("sq, d_qk, d_v, one_row", [(65, 8, 8, True), (129, 64, 64, True), (1, 8, 8, True),
                                                    (64, 8, 8, False), (33, 8, 8, False), (33, 144, 64, True),
                                                    (385, 8, 160, True), (96, 128, 128, False)])
def test_the_efficient_kernels_last_tile_holds_one_row_at_its_own_tile_height(sq, d_qk, d_v, one_row):
    assert TRAITS["last_query_tile_one_row"](Case(sq=sq, skv=8, d_qk=d_qk, d_v=d_v)) is one_row


@pytest.mark.parametrize("diagnosis", ["ALL_ZERO", "MASK_LEAK", "MASK_ALIGNMENT", "TOLERANCE", "EMPTY_ROWS"])
def test_expanded_kv_with_a_one_row_last_tile_is_the_tail_row_bug_and_nothing_else(diagnosis):
    record = "sdpa-efficient-FAIL-NONFINITE-dc7825b35e70"
    tail = Case(sq=129, skv=1, h=2, hk=2, d_qk=8, d_v=8, dtype="float16", memory="expanded_kv")
    assert _taken("sdpa-efficient", tail, _fail(diagnosis)) == record
    assert _taken("sdpa-efficient", tail.replace(sq=128), _fail(diagnosis)) != record   # a full last tile
    assert _taken("sdpa-efficient", tail.replace(memory="contiguous"), _fail(diagnosis)) != record


def test_a_head_dim_of_1_with_a_stride_is_sdpa_flashs_refused_layout_only():
    record = "sdpa-flash-CRASH-RuntimeError-22a75f8a68c6"
    crash = V.Verdict(V.CRASH, "RuntimeError",
                      "RuntimeError: Input tensor must have contiguous last dimension (at adapter.py:260)")
    unit = Case(sq=1, skv=1, h=2, hk=2, d_qk=1, d_v=1, dtype="float16", storage=("plain", "plain", "offset"))
    assert _taken("sdpa-flash", unit, crash) == record
    assert _taken("sdpa-flash", unit.replace(storage=("plain", "strided", "plain")), crash) == record
    assert _taken("sdpa-flash", unit.replace(storage=("plain", "plain", "plain")), crash) != record
    assert _taken("sdpa-flash", unit.replace(d_qk=8, d_v=8), crash) != record
    other = V.Verdict(V.CRASH, "RuntimeError", "RuntimeError: CUDA error: an illegal memory access was encountered")
    assert _taken("sdpa-flash", unit, other) != record


def test_cudnns_nan_gradient_from_a_half_padded_key_tile_needs_no_far_negative_values():
    """fp16, sq 1 over 64 keys, window (4, 0), default values: the row whose LSE was -16.3 came back with NaN dQ."""
    record = "sdpa-cudnn-FAIL-GRADIENT-e767de4b1636"
    nan = _fail("GRADIENT", "dq: worst of 2 rows at [1, 0, 0, 0]: diff_max=inf (ratio inf): got=nan expected=0")
    case = Case(b=2, sq=1, skv=64, d_qk=8, d_v=8, dtype="float16", window=(4, 0), grads=True)
    assert _taken("sdpa-cudnn", case, nan) == record
    assert _taken("sdpa-cudnn", case.replace(skv=128), nan) != record     # no padded half
    finite = _fail("GRADIENT", "dq: worst of 2 rows at [1, 0, 0, 0]: (ratio 3.1): got=0.25 expected=0")
    assert _taken("sdpa-cudnn", case, finite) != record


@pytest.mark.parametrize("diagnosis", ["TOLERANCE", "MASK_LEAK", "MASK_ALIGNMENT"])
def test_cudnns_finite_mask_fill_is_taken_where_logits_can_outrun_it_only(diagnosis):
    record = "sdpa-cudnn-FAIL-TOLERANCE-924fa1ebef22"
    case = Case(sq=7, skv=9, d_qk=8, d_v=8, dtype="float16", causal=True, scale=1.0, seqlens_q=(7,), seqlens_kv=(9,),
                values="outlier_channel")
    assert _taken("sdpa-cudnn", case, _fail(diagnosis)) == record
    assert _taken("sdpa-cudnn", case.replace(values="gaussian"), _fail(diagnosis)) != record


def test_cudnns_offset_storage_record_takes_its_wrong_finite_answers_too():
    record = "sdpa-cudnn-FAIL-NONFINITE-237c1ea5ea13"
    case = Case(sq=104, skv=98, h=3, hk=1, d_qk=96, d_v=96, dtype="float16", storage=("offset", "plain", "plain"))
    assert _taken("sdpa-cudnn", case, _fail("TOLERANCE")) == record
    assert _taken("sdpa-cudnn", case.replace(storage=("plain", "plain", "plain")), _fail("TOLERANCE")) != record


MHA_CAUSAL_PADDED = Case(sq=22, skv=22, d_qk=8, d_v=8, dtype="float16", causal=True, layout="sbhd",
                         seqlens_q=(22,), seqlens_kv=(22,), spelling="is_causal+key_padding_mask+mha_seq_first")


def test_a_module_call_that_merges_a_float32_causal_mask_is_cudnns_float32_mask_bug():
    """nn.MultiheadAttention with is_causal and a key_padding_mask hands SDPA the float32 mask of
    generate_square_subsequent_mask: on a half query that is the float32-mask bug, in fp32 or without padding not."""
    record = "sdpa-cudnn-FAIL-TOLERANCE-d74692bfb3b5"
    nan = _fail("NONFINITE", "non-finite output, first at [0, 0, 0, 0]: nan")
    assert _taken("sdpa-cudnn", MHA_CAUSAL_PADDED, nan) == record
    assert _taken("sdpa-cudnn", MHA_CAUSAL_PADDED.replace(dtype="bfloat16"), nan) == record
    assert _taken("sdpa-cudnn", MHA_CAUSAL_PADDED.replace(dtype="float32"), nan) != record
    assert _taken("sdpa-cudnn", MHA_CAUSAL_PADDED.replace(spelling="is_causal+mha_seq_first"), nan) != record
    assert _taken("sdpa-cudnn", MHA_CAUSAL_PADDED.replace(spelling="no_mask+key_padding_mask+mha_seq_first"),
                  nan) != record


@pytest.mark.parametrize("diagnosis", ["SCALE", "WINDOW_OFF_BY_ONE"])
def test_a_float32_mask_read_as_halves_also_reads_as_another_scale_or_window(diagnosis):
    record = "sdpa-cudnn-FAIL-TOLERANCE-d74692bfb3b5"
    case = Case(b=2, sq=2047, skv=2, h=2, hk=1, d_qk=160, d_v=40, dtype="bfloat16", causal=True, window=(1, None),
                alignment="bottom_right", spelling="float32_mask+repeat_kv+explicit_scale")
    assert _taken("sdpa-cudnn", case, _fail(diagnosis)) == record
    assert _taken("sdpa-cudnn", case.replace(spelling="float_mask+repeat_kv+explicit_scale"),
                  _fail(diagnosis)) != record


def test_the_efficient_tail_row_bug_also_faults_outside_the_global_address_space():
    record = "sdpa-efficient-FAIL-NONFINITE-dc7825b35e70"
    fault = V.Verdict(V.CRASH, "AcceleratorError",
                      "AcceleratorError: CUDA error: operation not supported on global/shared address space")
    tail = Case(b=3, sq=897, skv=897, h=2, hk=2, d_qk=32, d_v=96, dtype="float16", memory="expanded_kv")
    assert _taken("sdpa-efficient", tail, fault) == record
    assert _taken("sdpa-efficient", tail.replace(sq=896, skv=896), fault) != record   # a full last tile


def test_cudnns_nan_key_gradient_from_an_empty_query_sequence():
    record = "sdpa-cudnn-FAIL-GRADIENT-7514778a99c4"
    nan = _fail("GRADIENT", "dk: worst of 2 rows at [0, 0, 0, 0]: diff_max=inf (ratio inf): got=nan expected=0")
    case = Case(sq=1, skv=2, d_qk=8, d_v=8, dtype="float16", grads=True, seqlens_q=(0,), seqlens_kv=(2,))
    assert _taken("sdpa-cudnn", case, nan) == record
    assert _taken("sdpa-cudnn", case.replace(seqlens_q=(1,)), nan) != record
    finite = _fail("GRADIENT", "dk: worst of 2 rows at [0, 0, 0, 0]: (ratio 3.0): got=0.5 expected=0")
    assert _taken("sdpa-cudnn", case, finite) != record
