"""Known bugs precise both ways: a record takes its bug under each label it shows (the same mask spelled another
way, the labels one output matches), and nothing else with the same label and message."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from attnfuzz.cli import main
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import Oracle, grade
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store.known import when_fields
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.broken import DroppedCausal, SwappedAlignment

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = corpus_io.known_bugs(ROOT / "corpus")
DATA = ROOT / "tests" / "data"   # findings of an 80 s H200 campaign of sdpa-efficient (torch 2.11.0+cu130)
TOO = "; the rows that see no key are wrong too (they must be 0, got {got} at {index})"


def _taken(backend, case, verdict):
    hit = SHIPPED(backend, case, verdict)
    return hit and hit["id"]


# -- traits -----------------------------------------------------------------------------------------------------------
def test_the_causal_band_is_one_trait_however_it_is_spelled():
    assert when_fields(Case(causal=True))["causal_band"] and when_fields(Case(window=(None, 0)))["causal_band"]
    assert when_fields(Case(window=(3, 0)))["causal_band"]
    assert not when_fields(Case())["causal_band"] and not when_fields(Case(window=(None, 1)))["causal_band"]


def test_fa2s_causal_alibi_lse_record_takes_causal_bands_only():
    """FA2 adds slope * key index under a causal band (its is_causal kernel, and on the H200 a window (2, 0) too): the
    record takes an LSE failure of causal ALiBi, spelled either way, bounded on the left or not, and neither a band
    whose right side is open nor one without ALiBi."""
    assert when_fields(Case(window=(None, 0)))["full_causal"] and not when_fields(Case(window=(3, 0)))["full_causal"]
    lse = V.Verdict(V.FAIL, "LSE", "lse: worst of 2 rows")
    alibi = Case(sq=2, skv=2, h=1, hk=1, alibi_slopes=(0.25,))
    assert _taken("fa2", alibi.replace(causal=True), lse) == "fa2-FAIL-LSE-4d72d21f217d"
    assert _taken("fa2", alibi.replace(window=(None, 0)), lse) == "fa2-FAIL-LSE-4d72d21f217d"
    assert _taken("fa2", alibi.replace(window=(1, 0)), lse) == "fa2-FAIL-LSE-4d72d21f217d"
    assert _taken("fa2-kvcache", alibi.replace(window=(1, 0)), lse) == "fa2-kvcache-FAIL-LSE-64c8078216c0"
    assert not _taken("fa2", alibi.replace(window=(1, None)), lse)
    assert not _taken("fa2", Case(sq=2, skv=2, causal=True), lse)


def test_fa2s_right_bound_clamp_record_takes_the_bands_the_clamp_widens_only():
    """FA2 reads a right bound >= seqlen_k as unbounded (Dao-AILab/flash-attention#895): a top-left causal band with
    sq >= 2 skv needs a bottom-right right bound of sq - skv >= skv, which it drops; with sq < 2 skv the bound stays,
    and a band ignored there is another bug, NEW."""
    ignored = V.Verdict(V.FAIL, "MASK_IGNORED", "matches attention with no causal mask or window at all")
    widened = Case(sq=6, skv=3, d_qk=8, d_v=8, dtype="float16", causal=True)
    assert _taken("fa2-kvcache", widened, ignored) == "fa2-kvcache-FAIL-MASK_IGNORED-547c0401f7c9"
    assert _taken("fa2-kvcache", widened.replace(sq=9, causal=False, window=(None, 1)), ignored)
    assert not _taken("fa2-kvcache", widened.replace(sq=5), ignored)                   # right bound 2 < skv: kept
    tolerance = V.Verdict(V.FAIL, "TOLERANCE", "out: worst of 3 rows at [0, 0, 0, 6]")
    left_only = Case(sq=3, skv=1, d_qk=8, d_v=8, dtype="float16", window=(0, None), alignment="bottom_right")
    assert _taken("fa2", left_only, tolerance) == "fa2-FAIL-MASK_IGNORED-5911753a13d0"   # seqlen_k put in on the right
    assert not _taken("fa2", left_only.replace(sq=2), tolerance)                         # sq = skv + 1: nothing hidden
    assert not _taken("fa2-kvcache", widened.replace(alignment="bottom_right"), ignored)   # right 0: no clamp


def test_fa2s_infinite_lse_record_takes_rows_that_see_no_key_only():
    inf = V.Verdict(V.FAIL, "LSE", "a row with no visible key must have lse -inf, got inf at [0, 0, 0]")
    empty = Case(sq=2, skv=1, d_qk=8, d_v=8, dtype="float16", causal=True, alignment="bottom_right")
    assert _taken("fa2", empty.replace(sq=161), inf) == "fa2-FAIL-LSE-3752e49414b9"
    assert _taken("fa2-kvcache", empty, inf) == "fa2-kvcache-FAIL-LSE-bef0440b0d7f"
    other = V.Verdict(V.FAIL, "LSE", "lse: worst of 2 rows at [0, 0, 1]: diff_max=0.5")
    assert not _taken("fa2-kvcache", empty, other)                                     # an LSE off elsewhere: NEW


@pytest.mark.parametrize("case, empty", [
    (Case(sq=5, skv=2, causal=True, alignment="bottom_right"), True),     # rows 0-2 before the diagonal
    (Case(sq=5, skv=2, causal=True), False),                               # top-left: row i sees key 0
    (Case(sq=2, skv=5, window=(0, 0), alignment="bottom_right"), False),
    (Case(sq=6, skv=2, window=(1, None)), True),                           # rows past key 1 + 1 see nothing
    (Case(b=2, sq=3, skv=3, seqlens_kv=(3, 0)), True),                     # a sequence with no key
    (Case(b=2, sq=3, skv=3, seqlens_q=(0, 3), seqlens_kv=(0, 3)), False),  # no query there: nothing to see
    (Case(sq=1, skv=1, mask_density=0.1), True),                           # a random mask may hide every key
    (Case(sq=1, skv=1, mask_density=1.0), False),
])
def test_empty_rows_trait_agrees_with_the_oracle(case, empty):
    """The trait, computed from the case alone, against the float64 oracle's own empty rows (for a random mask
    the drawn mask decides: the trait says it may)."""
    assert when_fields(case)["empty_rows"] is empty
    if case.mask_density is None:
        assert bool(Oracle.of(case, materialize(case)).ref.empty.any()) is empty


# -- a different bug with the same label and message is NEW -----------------------------------------------------------
def _nan_dq(rows_that_see_keys: bool):
    """A planted gradient: the oracle's own output and gradients, with dQ NaN on the rows that see no key, or on a
    row that sees keys; the case has both (sequence 1 has no key), as the cuDNN record's does."""
    case = Case(b=2, sq=3, skv=3, d_qk=8, d_v=8, dtype="float16", seqlens_kv=(3, 0), grads=True)
    t = materialize(case)
    o = Oracle.of(case, t)
    dq = o.ref.dq.clone()
    dq[(0, 1) if rows_that_see_keys else (1, 0)] = float("nan")
    output = V.Output(o.ref.out.half(), dq=dq.half(), dk=o.ref.dk.half(), dv=o.ref.dv.half())
    return case, grade(case, t, output, oracle=o)


def test_a_nan_gradient_on_rows_that_see_keys_is_not_the_empty_row_bug():
    """sdpa-cudnn-FAIL-GRADIENT-543ff6679a8c is dQ NaN on a query whose keys are all masked: it took any NaN
    gradient of sdpa-cudnn. Both planted failures are GRADIENT with got=nan."""
    case, other = _nan_dq(rows_that_see_keys=True)
    assert other.label == "FAIL:GRADIENT" and "got=nan" in other.message, other
    assert _taken("sdpa-cudnn", case, other) is None
    case, same = _nan_dq(rows_that_see_keys=False)
    assert same.label == "FAIL:GRADIENT" and "got=nan" in same.message, same
    assert _taken("sdpa-cudnn", case, same) == "sdpa-cudnn-FAIL-GRADIENT-543ff6679a8c"


def test_a_swapped_alignment_is_not_the_dropped_lower_right_mask():
    """The dropped lower-right causal mask (sq > skv; sdpa-efficient-FAIL-MASK_IGNORED-bbc703f1fc56, MASK_ALIGNMENT
    among its labels) once had an entry of its own whose one case matched the other alignment too: it took any
    MASK_ALIGNMENT of sdpa-efficient."""
    case = Case(sq=2, skv=5, d_qk=8, d_v=8, dtype="float16", causal=True)
    t = materialize(case)
    verdict = grade(case, t, SwappedAlignment().run(case, t))
    assert verdict.label == "FAIL:MASK_ALIGNMENT", verdict
    assert _taken("sdpa-efficient", case, verdict) is None


@pytest.mark.parametrize("backend, entry", [("te-flash", "te-flash-CRASH-MLIRError-718554e4d2aa"),
                                            ("fa4", "fa4-CRASH-MLIRError-1ea4e7441de5")])
def test_an_mlir_error_is_the_narrow_value_dim_bug_only_where_d_v_is_narrower(backend, entry):
    crash = V.Verdict(V.CRASH, "MLIRError", "MLIRError: Operation creation failed")
    assert _taken(backend, Case(d_qk=96, d_v=8, grads=True), crash) == entry
    assert _taken(backend, Case(d_qk=64, d_v=64, grads=True), crash) is None   # another compile failure
    assert _taken(backend, Case(d_qk=96, d_v=8), crash) is None                # the forward: no sm90 backward


# -- the same bug under another label stays KNOWN ---------------------------------------------------------------------
def _finding(name):
    entry = json.loads((DATA / f"{name}.json").read_text())
    return Case.from_dict(entry["case"]), V.Verdict.from_dict(entry["verdict"])


def _too(verdict: V.Verdict, **changes) -> V.Verdict:
    w = verdict.worst
    return V.Verdict(V.FAIL, changes.get("diagnosis", verdict.diagnosis),
                     changes.get("message", verdict.message) + TOO.format(got=f"{w.got:.6g}", index=list(w.index)),
                     w, verdict.ratio)


def test_the_campaign_findings_of_sdpa_efficient_are_known_where_they_are_a_known_bug():
    """The five sdpa-efficient findings of the campaign, each with the verdict the grader now gives the failure it
    saved. The bug (sdpa-efficient-FAIL-MASK_IGNORED-bbc703f1fc56's row probe on the H200): a lower-right causal band with
    sq > skv runs each 64-row query block over the right key range with no mask inside it; a block whose rows see no
    key at all reads 0 (or, some runs, NaN: nothing divides by a key)."""
    # LSE at ratio 1.07 (fp32 anti_aligned, LSE ~ -16422, one key every row sees): no band, no empty row; the
    # grader gives it as saved. A near-1 bound question, no known bug: NEW.
    case, lse = _finding("sdpa-efficient-FAIL-LSE-fb7a5deec8ba")
    assert not when_fields(case)["empty_rows"]
    assert _taken("sdpa-efficient", case, lse) is None
    # window (None, 0) is the causal band spelled as a window. sq = 64: one block, the output is unmasked attention;
    # rows 61-63 see keys and match no mask, graded without the empty rows 0-60: MASK_IGNORED, empty rows wrong too
    case, ignored = _finding("sdpa-efficient-FAIL-MASK_IGNORED-7043cb744300")
    assert (case.causal, case.window, case.sq) == (False, (None, 0), 64)
    assert _taken("sdpa-efficient", case, _too(ignored)) == "sdpa-efficient-FAIL-MASK_IGNORED-bbc703f1fc56"
    # sq = 129, skv = 89, the band as a window: block 0 (rows 0-63) runs over keys 0-23 unmasked, so its rows that see
    # keys (40-63) match neither the band nor no mask: TOLERANCE (its worst row 33 sees no key), empty rows wrong too
    case, tolerance = _finding("sdpa-efficient-FAIL-TOLERANCE-b2cc8dc0a3bf")
    assert _taken("sdpa-efficient", case, _too(tolerance, message="out: worst of 387 rows at [0, 70, 0, 3]")) == \
        "sdpa-efficient-FAIL-MASK_IGNORED-bbc703f1fc56"
    # causal, sq = 104, skv = 21: rows 0-82 see no key. The NaN at row 15 is in block 0, whose rows see none; block 1
    # (rows 64-103) attends to all 21 keys unmasked, so its rows that see keys (83-103) match no mask: MASK_IGNORED,
    # the empty rows wrong too. The FLAKY entry is the same case: its runs read NaN once and garbage three times on
    # the empty rows, and all four now grade MASK_IGNORED on the other rows: one label, no longer FLAKY
    for name in ("sdpa-efficient-FAIL-NONFINITE-599d31237503", "sdpa-efficient-FLAKY-FAIL-NONFINITE-3a854022a1e6"):
        case, nan = _finding(name)
        assert case.causal and case.sq - case.skv == 83 and nan.worst.index[1] < 64, name
        now = _too(nan, diagnosis=V.MASK_IGNORED,
                   message="matches attention with no causal mask or window at all (the band was dropped); "
                           "out: worst of 208 rows at [0, 90, 0, 5]")
        assert _taken("sdpa-efficient", case, now) == "sdpa-efficient-FAIL-MASK_IGNORED-bbc703f1fc56", name


def test_a_failure_matching_a_known_alternative_too_is_that_bug(tmp_path):
    """A record of a dropped causal mask (MASK_IGNORED) takes the MASK_ALIGNMENT of sq = 1, skv = 2 and the
    WINDOW_OFF_BY_ONE of sq = skv = 2, whose outputs match no mask at all too; not a swapped alignment on sq = 2,
    skv = 4, whose output does not."""
    base = Case(sq=3, skv=3, d_qk=8, d_v=8, dtype="float16", causal=True)
    t = materialize(base)
    ignored = grade(base, t, DroppedCausal().run(base, t))
    assert ignored.label == "FAIL:MASK_IGNORED", ignored
    corpus_io.save(tmp_path, corpus_io.Entry("broken-causal-dropped", base, ignored,
                                             known_bug={"link": "https://example.org/drop"}), repro=False)
    known = corpus_io.known_bugs(tmp_path)
    for sq, skv, label in ((1, 2, "FAIL:MASK_ALIGNMENT"), (2, 2, "FAIL:WINDOW_OFF_BY_ONE")):
        case = base.replace(sq=sq, skv=skv)
        t = materialize(case)
        verdict = grade(case, t, DroppedCausal().run(case, t))
        assert verdict.label == label and V.MASK_IGNORED in verdict.also, verdict
        assert known("broken-causal-dropped", case, verdict) is not None, label
    case = base.replace(sq=2, skv=4)    # where the other alignment is not the whole key range
    t = materialize(case)
    swapped = grade(case, t, SwappedAlignment().run(case, t))
    assert swapped.label == "FAIL:MASK_ALIGNMENT" and V.MASK_IGNORED not in swapped.also, swapped
    assert known("broken-causal-dropped", case, swapped) is None


# -- a user's workflow: find, mark known, run again --------------------------------------------------------------------
SPEC = "tests.misbehaving:drops_causal"


def _run(corpus: Path, seed: int, examples: int) -> int:
    return main(["run", "--backend", SPEC, "--max-examples", str(examples), "--seed", str(seed), "--corpus",
                 str(corpus), "--profile", "ci"])


def test_a_dropped_causal_mask_marked_known_is_not_found_again(tmp_path, capsys):
    """A kernel that ignores causal is found as MASK_IGNORED (its other labels attached); `attnfuzz known` marks it
    with no --label or --when; the next runs save nothing new of it (they saved MASK_ALIGNMENT at sq 1 / skv 2 and
    WINDOW_OFF_BY_ONE at sq 161 / skv 2: the record took MASK_IGNORED alone)."""
    corpus = tmp_path / "corpus"
    assert _run(corpus, seed=1, examples=150) == 1
    [path] = corpus.glob("*-FAIL-MASK_IGNORED-*.json")
    assert main(["known", str(path), "--link", "https://example.org/drop", "--note", "drops causal"]) == 0
    record = corpus_io.load(path).known_bug
    attached = {v.label for _, v in corpus_io.load(path).attached}
    assert record["when"] == {} and set(record.get("labels", [])) == attached, record
    before = sorted(p.name for p in corpus.iterdir())
    capsys.readouterr()
    for seed in (2, 3):
        assert _run(corpus, seed=seed, examples=300) == 0, capsys.readouterr().err[-3000:]
        assert sorted(p.name for p in corpus.iterdir()) == before
        assert "KNOWN:" in capsys.readouterr().err


def test_known_refuses_a_when_that_leaves_out_the_findings_own_failures(tmp_path):
    """`--when causal=false` on a causal finding would take none of its failures: refused, nothing written."""
    case = Case(sq=3, skv=3, d_qk=8, d_v=8, dtype="float16", causal=True)
    t = materialize(case)
    verdict = grade(case, t, DroppedCausal().run(case, t))
    other = case.replace(sq=2, skv=2)
    attached = [(other, grade(other, materialize(other), DroppedCausal().run(other, materialize(other))))]
    path = corpus_io.save(tmp_path, corpus_io.Entry(SPEC, case, verdict, attached=attached), repro=False)
    assert main(["known", str(path), "--link", "l", "--when", "causal=false"]) == 2
    assert main(["known", str(path), "--link", "l", "--when", "sq=3"]) == 2          # the attached case has sq 2
    assert corpus_io.load(path).known_bug is None
    assert main(["known", str(path), "--link", "l", "--when", 'sq={"in": [3]}']) == 2      # not {"any_of": [...]}
    assert corpus_io.load(path).known_bug is None
    assert main(["known", str(path), "--link", "l", "--when", "causal=true"]) == 0
    assert corpus_io.load(path).known_bug["labels"] == ["FAIL:WINDOW_OFF_BY_ONE"]
    assert main(["known", str(path), "--link", "l", "--when", 'sq={"any_of": [2, 3]}']) == 0


def test_a_gradient_failure_names_the_alternatives_its_gradient_matches():
    """The dropped causal mask on probe values over a one-wide V: the output is right (every key a row sees is alike),
    dV is wrong, and right against attention without the mask: the GRADIENT verdict says so in `also`, so a record
    of the dropped mask (MASK_IGNORED) takes it. A correct kernel's dV matches no alternative: nothing to say."""
    from attnfuzz.backends import get
    from attnfuzz.engine.harness import run_case
    case = Case(sq=2, skv=2, d_qk=1, d_v=1, dtype="float16", causal=True, grads=True, values="probe")
    verdict = run_case(get("tests.misbehaving:drops_causal", "cpu"), case, device="cpu")
    assert verdict.label == "FAIL:GRADIENT" and V.MASK_IGNORED in verdict.also, verdict
    scaled = run_case(get("tests.misbehaving:drops_causal", "cpu"), case.replace(causal=False, grads=True,
                                                                                   scale=0.3), device="cpu")
    assert not scaled.failed, scaled


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
    assert not _taken("fa4", full.replace(softmax="vanilla"), zero_dq)
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
