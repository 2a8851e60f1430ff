"""Each shipped known-bug record takes its own bug (its faces, its conditions) and no other failure of the same
label: per backend, the records whose `when` names traits, alternatives or knobs."""

from __future__ import annotations

import dataclasses

from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from tests.shipped import taken as _taken


def test_cudnns_float32_mask_record_takes_the_hidden_keys_it_shows_and_only_through_that_mask():
    """cuDNN reads a float32 mask on a half-precision query as halves: a row's first halves are the zero low halves of
    its 0 / -inf floats, so hidden keys show. On an H100 that read as MASK_ALIGNMENT (sq 1, skv 2) and MASK_LEAK (sq 1,
    skv 4); the same labels through any other mask spelling are another bug, NEW."""
    causal = Case(sq=1, skv=2, d_qk=8, d_v=8, dtype="float16", causal=True)
    alignment = V.Verdict(V.FAIL, "MASK_ALIGNMENT", "matches alignment='bottom_right'")
    leak = V.Verdict(V.FAIL, "MASK_LEAK", "probe: a key the row must not see was counted")
    record = "sdpa-cudnn-FAIL-TOLERANCE-d74692bfb3b5"
    assert _taken("sdpa-cudnn", causal.replace(spelling="float32_mask+mask_expanded"), alignment) == record
    assert _taken("sdpa-cudnn", causal.replace(skv=4, dtype="bfloat16", spelling="float32_mask+mask_1_1"),
                  leak) == record
    assert not _taken("sdpa-cudnn", causal.replace(spelling="bool_mask+mask_expanded"), alignment)
    assert not _taken("sdpa-cudnn", causal.replace(skv=4, spelling="float_mask"), leak)


def test_flexs_prescale_record_takes_the_prescale_knob_only():
    """compiled flex's PRESCALE_QK rounds log2(e) to the input dtype: the record takes an LSE failure with that knob
    among the spelling's parts, not one of another knob or of the default spelling."""
    lse = V.Verdict(V.FAIL, "LSE", "lse: worst of 1 rows")
    one_key = Case(sq=1, skv=1, d_qk=16, d_v=16, dtype="float16")
    record = "flex-compiled-FAIL-LSE-42095620e990"
    assert _taken("flex-compiled", one_key.replace(spelling="prescale"), lse) == record
    assert _taken("flex-compiled", one_key.replace(spelling="prescale+rows_safe"), lse) == record
    assert not _taken("flex-compiled", one_key.replace(spelling="triton"), lse)
    assert not _taken("flex-compiled", one_key, lse)


def test_flexs_flash_backend_clamp_record_takes_packed_flash_cases_only():
    """The FLASH backend cannot lower the packed mask's clamp (CuteDSL has no `maximum`): the record takes that
    InductorError of a packed FLASH case, not a padded one, not the Triton backend's, nor another missing op."""
    maximum = V.Verdict(V.CRASH, "InductorError", "InductorError: LoweringException: RuntimeError: CuteDSL template "
                        "failed: ====\nUNSUPPORTED CUTEDSL OPERATION: 'maximum'\n====")
    packed = Case(b=1, sq=1, skv=1, d_qk=16, d_v=16, dtype="float16", layout="thd", seqlens_q=(1,), seqlens_kv=(1,),
                  spelling="flash")
    record = "flex-compiled-CRASH-InductorError-e2cc7e0c437a"
    assert _taken("flex-compiled", packed, maximum) == record
    assert not _taken("flex-compiled", packed.replace(layout="bshd", seqlens_q=None, seqlens_kv=None), maximum)
    assert not _taken("flex-compiled", packed.replace(spelling=""), maximum)
    exp = dataclasses.replace(maximum, message=maximum.message.replace("'maximum'", "'exp2'"))
    assert not _taken("flex-compiled", packed, exp)


def test_flashinfer_paged_prefills_empty_row_record_and_te_unfuseds_fp16_overflow_record_stay_narrow():
    """The paged prefill's bottom-right band over fewer keys (flashinfer-ai/flashinfer#4452) takes its TOLERANCE and
    MASK_ALIGNMENT faces where rows see no key, not a band without empty rows; te-unfused's fp16 logit overflow takes
    NaN of fp16 outlier-channel cases, not bf16 ones (whose range holds the logit) nor other values."""
    tolerance = V.Verdict(V.FAIL, "TOLERANCE", "out: worst of 2 rows")
    paged = Case(sq=4, skv=2, d_qk=8, d_v=8, dtype="float16", causal=True, alignment="bottom_right", page_size=1)
    record = "flashinfer-paged-prefill-FAIL-MASK_ALIGNMENT-e3b4a27dc3ac"
    assert _taken("flashinfer-paged-prefill", paged, tolerance) == record
    assert not _taken("flashinfer-paged-prefill", paged.replace(sq=2), tolerance), "no empty row: another bug"
    assert not _taken("flashinfer-ragged", paged.replace(page_size=None, sq=2), tolerance)
    nan = V.Verdict(V.FAIL, "NONFINITE", "non-finite output, first at [0, 0, 0, 0]: nan")
    outlier = Case(sq=1, skv=1, d_qk=1, d_v=1, dtype="float16", values="outlier_channel")
    assert _taken("te-unfused", outlier, nan) == "te-unfused-FAIL-NONFINITE-48b7e9aec4c2"
    assert not _taken("te-unfused", outlier.replace(dtype="bfloat16"), nan)
    assert not _taken("te-unfused", outlier.replace(values="gaussian"), nan)


def test_fa4s_tensor_max_seqlen_record_takes_that_form_only():
    """FA4 4.0.0b36 drops a tensor max_seqlen only on SM100; on sm90 the varlen call raises ValueError. The record
    takes that crash where the form is spelled, not a ValueError of an int max_seqlen."""
    crash = V.Verdict(V.CRASH, "ValueError", "ValueError: Expected IntTuple, whose leaves are integers, but got 1")
    varlen = Case(sq=1, skv=1, d_qk=8, d_v=8, dtype="float16", seqlens_q=(1,), seqlens_kv=(1,))
    assert _taken("fa4", varlen.replace(spelling="max_seqlen_tensor"), crash) == "fa4-CRASH-ValueError-d690f8f46078"
    assert not _taken("fa4", varlen.replace(spelling="no_max_seqlen"), crash)


def test_a_when_value_may_list_alternatives_and_fa4s_paged_record_takes_head_dims_160_and_176_only():
    """FA4's paged-cache read past its pages showed the same 113-key step at head dims 160 and 176: one record, its
    `when` listing both ({"any_of": [160, 176]}); head dim 128, and head dim 160 without a paged cache, stay NEW. An
    object of another form is refused, naming the field."""
    from attnfuzz.store.known import meets, record_problem
    assert meets({"d_qk": {"any_of": [160, 176]}}, {"d_qk": 176})
    assert not meets({"d_qk": {"any_of": [160]}}, {"d_qk": 96})
    crash = V.Verdict(V.CRASH, "CUDA_ILLEGAL_ADDRESS", "AcceleratorError: CUDA error: an illegal memory access")
    lse = V.Verdict(V.FAIL, "LSE", "lse: worst of 1 rows")
    paged = Case(sq=1, skv=113, d_qk=160, d_v=160, dtype="float16", page_size=1)
    entry = "fa4-FAIL-TOLERANCE-e015b8aca2c3"
    assert _taken("fa4", paged, crash) == entry and _taken("fa4", paged.replace(skv=56), lse) == entry
    assert _taken("fa4", paged.replace(d_qk=176, d_v=176), crash) == entry
    assert not _taken("fa4", paged.replace(d_qk=128, d_v=128), crash)
    assert not _taken("fa4", paged.replace(page_size=None), crash)
    problem = record_problem({"link": "x", "when": {"d_qk": {"in": [160]}}}, paged)
    assert problem and "d_qk" in problem and "any_of" in problem
    assert record_problem({"link": "x", "when": {"d_qk": {"any_of": [160, 176]}}}, paged) is None


def test_one_record_per_root_cause_takes_its_gradient_and_lse_faces():
    """TE's get_full_mask window (skv, sq) hides keys of top-left rows: its dV face on a thd batch of 130 queries over
    one key is the same record's, a gradient failure of a bottom-right case with equal lengths is not. torch's ring
    merge downcasts float64: its TOLERANCE record takes the LSE and gradient faces of float64, none of float32."""
    grad = V.Verdict(V.FAIL, "GRADIENT", "dv: worst of 2 rows at [0, 0, 0, 0]")
    thd = Case(b=3, sq=130, skv=1, d_qk=8, d_v=8, dtype="float16", layout="thd", seqlens_q=(130, 130, 130),
               seqlens_kv=(1, 0, 1), grads=True, values="zero_rows")
    assert _taken("te-unfused", thd, grad) == "te-unfused-FAIL-TOLERANCE-24bde40818b5"
    assert not _taken("te-unfused", Case(sq=4, skv=4, d_qk=8, d_v=8, dtype="float16", grads=True, causal=True,
                                         alignment="bottom_right"), grad)
    ring = Case(sq=8, skv=8, d_qk=8, d_v=8, dtype="float64", causal=True, grads=True)
    lse = V.Verdict(V.FAIL, "LSE", "lse: worst of 8 rows")
    for backend in ("ring-allgather", "ring-alltoall"):
        assert _taken(backend, ring, grad).startswith(f"{backend}-FAIL-TOLERANCE-")
        assert _taken(backend, ring, lse) == _taken(backend, ring, grad)
        assert not _taken(backend, ring.replace(dtype="float32"), grad)


def test_tes_unpacked_strides_record_takes_padded_rows_nan_and_not_a_packed_case():
    """TE classes q, k, v by k's and v's strides alone and hands cuDNN packed strides: one record takes what that
    does to padded rows (NaN read from the padding), head-major q and expanded K/V; a NaN of packed tensors is not
    it, and a NaN of a buffer one element off (misaligned, another bug) is taken by that bug's record."""
    nan = V.Verdict(V.FAIL, "NONFINITE", "non-finite output, first at [0, 1, 0, 0]: nan")
    packed = Case(b=1, sq=2, skv=1, h=1, hk=1, d_qk=8, d_v=8, dtype="float16")
    record = "te-fused-FAIL-TOLERANCE-8158dad798b0"
    assert _taken("te-fused", packed.replace(storage=("padded_rows", "plain", "plain")), nan) == record
    assert _taken("te-fused", packed.replace(storage=("plain", "padded_rows", "padded_rows")), nan) == record
    leak = V.Verdict(V.FAIL, "MASK_LEAK", "a masked key leaks")
    assert _taken("te-fused", packed.replace(h=2, hk=2, memory="transposed"), leak) == record
    assert not _taken("te-fused", packed, nan)
    assert _taken("te-fused", packed.replace(storage=("plain", "plain", "offset")), nan) == (
        "te-fused-FAIL-NONFINITE-020da46bcd3d")
    assert not _taken("te-unfused", packed.replace(storage=("padded_rows", "plain", "plain")), nan)


def test_flexs_flash_lse_record_takes_the_flash_backend_only():
    """torch 2.11's compiled FLASH backend returns the LSE times ln 2: the record takes an LSE failure of a case
    spelled with BACKEND="FLASH" (alone or with other knobs), not the Triton backend's nor the default spelling's."""
    lse = V.Verdict(V.FAIL, "LSE", "lse: worst of 16 rows")
    case = Case(b=2, sq=1, skv=1, h=8, hk=2, d_qk=72, d_v=72, dtype="bfloat16")
    record = "flex-compiled-FAIL-LSE-e5a350cdfc9b"
    assert _taken("flex-compiled", case.replace(spelling="flash"), lse) == record
    assert not _taken("flex-compiled", case.replace(spelling="triton"), lse)
    assert not _taken("flex-compiled", case, lse)
    assert not _taken("flex-eager", case.replace(spelling="triton"), lse)


def test_tes_expanded_kv_fault_is_known_and_its_nan_face_stays_with_the_stride_record():
    """Expanded K/V read as packed runs past the keys' storage: a fault on a long expanded case is the crash record's,
    its NaN face the stride record's; a fault of packed K/V is neither."""
    fault = V.Verdict(V.CRASH, "CUDA_ILLEGAL_ADDRESS", "AcceleratorError: CUDA error: an illegal memory access")
    nan = V.Verdict(V.FAIL, "NONFINITE", "non-finite output, first at [0, 0, 0, 0]: nan")
    long = Case(b=1, sq=9, skv=131008, h=3, hk=3, d_qk=8, d_v=96, dtype="float16", layout="sbhd")
    assert _taken("te-fused", long.replace(memory="expanded_kv"), fault) == (
        "te-fused-FLAKY-CRASH-CUDA_ILLEGAL_ADDRESS-b610688085cb")
    assert _taken("te-fused", long.replace(memory="expanded_kv"), nan) == "te-fused-FAIL-TOLERANCE-8158dad798b0"
    assert not _taken("te-fused", long, fault)


def test_fa4s_sink_varlen_backward_record_takes_full_sequences_and_its_other_build_failure_is_its_own():
    """FA4's varlen backward with a sink leaves a later sequence's dq at 0 with or without an empty sequence before
    it, and not without a sink; head dim 104's backward build failure has its own record, d_v < d_qk's stays."""
    zero_dq = V.Verdict(V.FAIL, "GRADIENT", "dq: worst of 2 rows at [1, 0, 0, 3]: diff_max=3.079e-02 "
                        "baseline_max=6.299e-06 k=4 floor=1.057e-02 (ratio 2.91): got=0 expected=-0.0307859")
    full = Case(b=2, sq=1, skv=1, d_qk=8, d_v=8, dtype="float16", seqlens_q=(1, 1), seqlens_kv=(1, 1),
                softmax="off_by_one", softcap=0.5, grads=True)
    record = "fa4-FAIL-GRADIENT-107394195030"
    assert _taken("fa4", full, zero_dq) == record
    assert _taken("fa4", full.replace(softcap=None, softmax="learnable", layout="thd"), zero_dq) == record
    assert _taken("fa4", full.replace(softmax="vanilla"), zero_dq) != record
    assert not _taken("fa4", full.replace(b=1, seqlens_q=None, seqlens_kv=None), zero_dq)
    partition = V.Verdict(V.CRASH, "MLIRError", "MLIRError: Operation creation failed:\nerror: unknown: failed to "
                          "partition `input` '!cute.shape<\"(112,80)\">' with `tiled_mma`")
    d104 = Case(sq=1, skv=1, d_qk=104, d_v=104, dtype="float16", grads=True)
    assert _taken("fa4", d104, partition) == "fa4-CRASH-MLIRError-f05d086f0304"
    assert not _taken("fa4", d104.replace(grads=False), partition)
    assert _taken("fa4", d104.replace(d_qk=32, d_v=8), partition) == "fa4-CRASH-MLIRError-1ea4e7441de5"


def test_fa4s_paged_record_takes_head_dim_144_and_its_dropped_keys():
    drop = V.Verdict(V.FAIL, "MASK_DROP", "probe: a key the row sees was dropped")
    paged = Case(b=2, sq=49, skv=49, d_qk=144, d_v=176, dtype="bfloat16", page_size=64)
    assert _taken("fa4", paged, drop) == "fa4-FAIL-TOLERANCE-e015b8aca2c3"
    assert not _taken("fa4", paged.replace(d_qk=128, d_v=128), drop)


def test_fa4s_varlen_backward_record_takes_later_sequences_off_the_32_grain_with_gqa_or_without():
    """FA4's sm90 varlen backward gets later sequences' gradients wrong at head dims off the 32-column grain, with GQA
    or without (one root cause): its record takes that (a batch of lengths or thd), not one sequence, not head dim
    32; the key-64 record takes dV's face past the first 64 keys, not a case of 64 keys."""
    zero_dq = V.Verdict(V.FAIL, "GRADIENT", "dq: worst of 2 rows at [1, 0, 0, 5]: got=0 expected=0.244077")
    varlen = Case(b=2, sq=1, skv=2, d_qk=8, d_v=8, dtype="float16", seqlens_q=(1, 1), seqlens_kv=(2, 2), grads=True)
    record = "fa4-FAIL-GRADIENT-6e7f38b6bdc4"
    assert _taken("fa4", varlen, zero_dq) == record
    assert _taken("fa4", varlen.replace(h=2, hk=1), zero_dq) == record
    assert _taken("fa4", varlen.replace(d_qk=48, d_v=48, layout="thd", dtype="bfloat16"), zero_dq) == record
    assert not _taken("fa4", varlen.replace(d_qk=32, d_v=32), zero_dq)
    assert not _taken("fa4", varlen.replace(b=1, seqlens_q=None, seqlens_kv=None), zero_dq)
    dv = V.Verdict(V.FAIL, "GRADIENT", "dv: worst of 195 rows at [0, 64, 0, 7]: got=0 expected=0.0708187")
    gqa = Case(sq=1, skv=65, h=6, hk=3, d_qk=8, d_v=8, dtype="bfloat16", grads=True)
    assert _taken("fa4", gqa, dv) == "fa4-FAIL-GRADIENT-e32a1f0db3ed"
    assert not _taken("fa4", gqa.replace(skv=64), dv)


def test_fa4s_minus_one_bound_record_takes_its_probe_leak_only_when_spelled_so():
    """A left bound spelled -1 beside a right one keeps only the keys after the row's own: on probe values a kept key
    reads as a leak. The record takes that with the -1 spelling, not the same leak of a window spelled None."""
    leak = V.Verdict(V.FAIL, "MASK_LEAK", "probe: a key the row must not see was counted")
    case = Case(b=1, sq=156, skv=156, h=2, hk=1, d_qk=136, d_v=136, dtype="bfloat16", window=(None, 4),
                values="probe", spelling="neg")
    assert _taken("fa4", case, leak) == "fa4-FAIL-ALL_ZERO-2bcd89f2de1d"
    assert not _taken("fa4", case.replace(spelling=""), leak)


def test_tes_unfused_records_take_the_window_face_and_both_sides_of_a_zero_max_seqlen():
    """TE's get_full_mask drops keys of top-left rows whose lengths differ: with a right bound that reads as the bound
    one short (WINDOW_OFF_BY_ONE), equal lengths are not it. Without max_seqlen, a thd side whose every sequence is
    empty gets a max_seqlen of 0: IndexError on dimension 2 (queries) or 3 (keys), one record; with max_seqlen given
    it is not that record's."""
    short = V.Verdict(V.FAIL, "WINDOW_OFF_BY_ONE", "matches the right bound 1 instead of 2")
    case = Case(sq=1, skv=3, h=4, hk=2, d_qk=8, d_v=8, dtype="float16", window=(None, 2), mask_density=0.5)
    assert _taken("te-unfused", case, short) == "te-unfused-FAIL-TOLERANCE-24bde40818b5"
    assert not _taken("te-unfused", case.replace(skv=1), short)
    record = "te-unfused-CRASH-IndexError-94b663686a23"
    for lens_q, lens_kv, dim in (((0,), (1,), 2), ((1,), (0,), 3)):
        crash = V.Verdict(V.CRASH, "IndexError", f"IndexError: index 0 is out of bounds for dimension {dim} with size 0")
        empty = Case(sq=1, skv=1, d_qk=8, d_v=8, dtype="float16", layout="thd", seqlens_q=lens_q, seqlens_kv=lens_kv,
                     spelling="no-max-seqlen")
        assert _taken("te-unfused", empty, crash) == record
        assert not _taken("te-unfused", empty.replace(spelling=""), crash)


def test_flashinfers_lse_drift_record_takes_long_rows_only():
    """FlashInfer's FA2 prefill moves the LSE once per 64-key tile after a row's maximum: the record takes an LSE
    failure over more than 1024 keys, not a short row's, nor another label."""
    lse = V.Verdict(V.FAIL, "LSE", "lse: worst of 8919 rows at [0, 0, 7439]: diff_max=1.884e-04")
    long = Case(sq=2048, skv=2048, d_qk=64, d_v=64, dtype="float16", std=(4.0, 4.0, 1.0))
    record = "flashinfer-single-prefill-FAIL-LSE-c7683dff792e"
    assert _taken("flashinfer-single-prefill", long, lse) == record
    assert not _taken("flashinfer-single-prefill", long.replace(sq=1024, skv=1024), lse)
    assert not _taken("flashinfer-single-prefill", long, V.Verdict(V.FAIL, "TOLERANCE", "out: worst of 2048 rows"))


def test_fa4s_split_head_dim_crash_records_take_their_own_regions_only():
    """On an H100 FA4's forward read out of bounds exactly where d_v is more than twice d_qk (below 256) and failed to
    build at d_v 256 with d_qk up to 64: each record takes its region, not its neighbours', so a crash of another
    split pair (a launch refused for its shared memory) is news, not a known illegal address."""
    illegal = V.Verdict(V.CRASH, V.CUDA_ILLEGAL_ADDRESS, "AcceleratorError: CUDA error: an illegal memory access")
    registers = V.Verdict(V.CRASH, "CompilerDiagnosticError", "PTX assembly failed: Insufficient registers (128)")
    case = Case(sq=64, skv=64, h=2, hk=2, d_qk=16, d_v=64, dtype="bfloat16")
    for d_qk, d_v in ((8, 64), (16, 128), (32, 72)):
        assert _taken("fa4", case.replace(d_qk=d_qk, d_v=d_v), illegal), (d_qk, d_v)
        assert _taken("te-flash", case.replace(d_qk=d_qk, d_v=d_v), illegal), (d_qk, d_v)
    for d_qk, d_v in ((32, 64), (64, 128), (128, 16), (8, 256)):
        assert not _taken("fa4", case.replace(d_qk=d_qk, d_v=d_v), illegal), (d_qk, d_v)
    assert _taken("fa4", case.replace(d_qk=64, d_v=256), registers) == "fa4-CRASH-CompilerDiagnosticError-35286a1b5f35"
    assert _taken("te-flash", case.replace(d_qk=8, d_v=256), registers)
    assert not _taken("fa4", case.replace(d_qk=128, d_v=256), registers)


def test_sdpas_offset_fault_records_take_head_dims_torch_reads_in_place():
    """Flash and memory-efficient SDPA fault on an offset tensor they read in place (head dim a multiple of 8); one
    whose head dim torch pads into an aligned copy does not fault, so a failure there is not that record's: the
    head-dim-1 RuntimeError keeps its own."""
    fault = V.Verdict(V.CRASH, "AcceleratorError", "AcceleratorError: CUDA error: misaligned address")
    case = Case(d_qk=8, d_v=8, storage=("plain", "plain", "offset"))
    assert _taken("sdpa-flash", case, fault) == "sdpa-flash-CRASH-EXIT_1-fac5df0cfa14"
    assert _taken("sdpa-flash", case.replace(d_qk=72, d_v=72, storage=("offset", "plain", "plain")), fault)
    assert _taken("sdpa-efficient", case.replace(d_qk=24, d_v=24), fault)
    assert not _taken("sdpa-flash", case.replace(d_qk=3, d_v=3), fault)
    assert not _taken("sdpa-flash", case.replace(d_qk=100, d_v=100), fault)
    raised = V.Verdict(V.CRASH, "RuntimeError", "RuntimeError: Input tensor must have contiguous last dimension")
    assert _taken("sdpa-flash", case.replace(d_qk=1, d_v=1, h=2, hk=2), raised) == \
        "sdpa-flash-CRASH-RuntimeError-22a75f8a68c6"


def test_records_of_the_triaged_campaign_findings_take_their_faces_not_their_neighbours():
    """te-unfused's -10000 mask fill takes its TOLERANCE face on anti-aligned rows, not far-negative ones (they stay
    above the fill); te-fused's thd ALiBi dV needs ALiBi; FA4's paged head dim 80 takes its lost key and its LSE, not
    head dim 64 or an unpaged case; FA4's refused launch takes d_v 256 above a narrower d_qk, not d_v 192 below 256."""
    tolerance = V.Verdict(V.FAIL, "TOLERANCE", "out: worst of 69 rows")
    rows = Case(b=2, sq=65, skv=65, d_qk=8, d_v=8, dtype="float32", seqlens_q=(4, 65), seqlens_kv=(4, 65),
                window=(4, 4), layout="sbhd", values="anti_aligned")
    assert _taken("te-unfused", rows, tolerance) == "te-unfused-FAIL-ALL_ZERO-af19f0b928e6"
    assert not _taken("te-unfused", rows.replace(values="far_negative"), tolerance)
    dv = V.Verdict(V.FAIL, "GRADIENT", "dv: worst of 4 rows at [0, 0, 0, 61]: got=0 expected=3.67188")
    thd = Case(b=2, sq=1, skv=1, h=2, hk=2, d_qk=72, d_v=72, layout="thd", seqlens_q=(1, 1), seqlens_kv=(1, 1),
               alibi_slopes=(0.0625, 0.00390625), grads=True)
    assert _taken("te-fused", thd, dv) == "te-fused-FAIL-GRADIENT-137123b13ef1"
    assert not _taken("te-fused", thd.replace(alibi_slopes=None), dv)
    lost = V.Verdict(V.FAIL, "TOLERANCE", "probe: the row is off by -1 of one key's weight")
    lse = V.Verdict(V.FAIL, "LSE", "row [0, 0, 0] has every logit shifted by -1023.22")
    paged = Case(sq=1, skv=64, d_qk=80, d_v=80, dtype="bfloat16", page_size=17, values="probe")
    assert _taken("fa4", paged, lost) == _taken("fa4", paged, lse) == "fa4-FAIL-TOLERANCE-e93be4fa9d88"
    assert not _taken("fa4", paged.replace(d_qk=64, d_v=64), lost)
    assert not _taken("fa4", paged.replace(page_size=None), lost)
    launch = V.Verdict(V.CRASH, "CUDADialectError", "CUDADialectError: CUDA launch failed: cudaErrorInvalidValue")
    wide = Case(sq=1, skv=1, h=2, hk=2, d_qk=160, d_v=256, grads=True)
    assert _taken("fa4", wide, launch) == "fa4-CRASH-CUDADialectError-7d20072f25bf"
    assert _taken("fa4", wide.replace(d_qk=128, d_v=192), V.Verdict(V.CRASH, "RuntimeError", "CUDA Error Code: 1"))
    assert not _taken("fa4", wide.replace(d_qk=256, d_v=192), launch)
    assert not _taken("fa4", wide.replace(d_qk=64, d_v=128), launch)
