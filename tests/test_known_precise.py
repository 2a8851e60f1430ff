"""Known bugs precise both ways: a record takes its bug under each label it shows (the same mask spelled another
way, the labels one output matches), and nothing else with the same label and message."""

from __future__ import annotations

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
from tests.shipped import taken as _taken

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"   # findings of an 80 s H200 campaign of sdpa-efficient (torch 2.11.0+cu130)
TOO = "; the rows that see no key are wrong too (they must be 0, got {got} at {index})"


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
