"""Corpus entries: saved, merged by signature, replayed, repro scripts that run alone, corrupt files named. (The ISA
an entry was found under: tests/test_isa.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import replay as replay_io
from attnfuzz.store.known import when_fields
from attnfuzz.cli import main
from attnfuzz.engine.harness import Finding, fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space
from tests.broken import BROKEN, Correct

CASE = Case(sq=3, skv=5, d_qk=8, d_v=8, dtype="float16", causal=True, alignment="bottom_right", seed=5)
FAIL = V.Verdict(V.FAIL, V.ALL_ZERO, "every graded output element is 0", V.Worst("out", (0, 0, 0, 0), 0.0, 1.0))


def _entry(case=CASE, backend="sdpa-math", verdict=FAIL, **kw):
    return corpus_io.Entry(backend=backend, case=case, verdict=verdict, **kw)


def test_entry_round_trips_and_duplicates_merge(tmp_path):
    first = corpus_io.save(tmp_path, _entry())
    again = corpus_io.save(tmp_path, _entry(case=CASE.replace(seed=9)))   # same bug, other numbers
    assert first == again and len(list(tmp_path.glob("*.json"))) == 1
    entry = corpus_io.load(first)
    assert entry.seen == 2 and entry.case == CASE and entry.verdict.label == "FAIL:ALL_ZERO"
    data = json.loads(first.read_text())
    assert {"schema", "signature", "backend", "backend_version", "environment", "case", "verdict", "found"} <= set(data)
    assert data["environment"]["torch"]
    assert data["environment"]["cpu_capability"] == corpus_io.host_isa()   # the vector ISA torch's CPU kernels ran


@pytest.mark.parametrize("mutate, named", [
    (lambda d: d.pop("backend"), "missing field 'backend'"),
    (lambda d: d["case"].update(h=3, hk=2), "field 'case': Case: invalid hk=2"),
    (lambda d: d["case"].update(colour="red"), "unknown field(s) ['colour']"),
    (lambda d: d.update(schema=99), "field 'schema' is 99"),
    (lambda d: d.update(known_bug={"note": "no link"}), "field 'known_bug'"),
])
def test_corrupt_entry_names_file_and_field(tmp_path, mutate, named):
    path = corpus_io.save(tmp_path, _entry(), repro=False)
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    with pytest.raises(corpus_io.CorpusError) as e:
        corpus_io.load(path)
    assert str(path) in str(e.value) and named in str(e.value)


def test_one_corrupt_file_does_not_stop_the_others(tmp_path):
    corpus_io.save(tmp_path, _entry(), repro=False)
    (tmp_path / "broken.json").write_text("{not json")
    entries, errors = corpus_io.load_all(tmp_path)
    assert len(entries) == 1 and len(errors) == 1 and "broken.json: not valid JSON" in str(errors[0])


NOT_UTF8 = b"\xff\xfe{\"schema\": 1}"


def test_a_file_that_is_not_utf8_is_named_as_unreadable(tmp_path):
    corpus_io.save(tmp_path, _entry(), repro=False)
    (tmp_path / "binary.json").write_bytes(NOT_UTF8)
    with pytest.raises(corpus_io.CorpusError, match="binary.json: not UTF-8 text"):
        corpus_io.load(tmp_path / "binary.json")
    entries, errors = corpus_io.load_all(tmp_path)
    assert len(entries) == 1 and len(errors) == 1 and "binary.json: not UTF-8" in str(errors[0])
    other = _entry(case=CASE.replace(sq=2))
    (tmp_path / other.filename).write_bytes(NOT_UTF8)  # a finding whose file is such: replaced, as one not JSON is
    assert corpus_io.load(corpus_io.save(tmp_path, other, repro=False)).case == other.case


@pytest.mark.parametrize("content", [NOT_UTF8, b"{not json"], ids=["not UTF-8", "not JSON"])
def test_an_unreadable_entry_exits_2_not_1(tmp_path, capsys, content):
    """Named on its own it is bad input (2) for every command that reads one; in a folder it is listed and the others
    replay, and it makes the exit 2 unless something regressed (1)."""
    good = corpus_io.save(tmp_path, _entry(backend="sdpa-math", case=CASE.replace(sq=4)), repro=False)
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    for argv in (["replay", str(bad)], ["report-bug", str(bad)], ["shrink", str(bad)],
                 ["known", str(bad), "--link", "l"]):
        assert main(argv) == 2, argv
        assert "bad.json" in capsys.readouterr().err, argv
    assert main(["replay", str(good)]) == 0  # control: a readable entry whose bug is not there (sdpa-math is right)
    assert main(["replay", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "bad.json" in out and "pass " in out and "0 regressed, 1 unreadable or not importable" in out
    corpus_io.save(tmp_path, _entry(backend="sdpa-math", case=CASE.replace(sq=5), known_bug={"link": "l"}),
                   repro=False)  # a known bug that no longer fails: that regression outranks the unreadable file
    assert main(["replay", str(tmp_path)]) == 1


def test_replay_passes_on_a_correct_backend_and_reports_loudly(tmp_path, capsys):
    corpus_io.save(tmp_path, _entry(backend="sdpa-math"), repro=False)            # sdpa-math is correct here
    known = _entry(backend="sdpa-math", case=CASE.replace(sq=4), known_bug={"link": "https://example.org/1"})
    corpus_io.save(tmp_path, known, repro=False)
    (tmp_path / "zz.json").write_text("[]")
    assert main(["replay", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "pass " in out and "KNOWN BUG NOW PASSES" in out and "zz.json: expected a JSON object" in out


def test_repro_script_runs_alone_and_fails_while_the_bug_is_there(tmp_path):
    """The script carries the inputs and the float64 answer; it needs torch and the backend, not attnfuzz."""
    case = Case(sq=4, skv=6, h=2, hk=1, d_qk=8, d_v=8, dtype="bfloat16", causal=True, seed=3)
    path = corpus_io.save(tmp_path, _entry(case=case, backend="sdpa-math"))
    script = path.with_suffix(".py")
    text = script.read_text()
    assert "import fuzz" not in text and "from fuzz" not in text and "oracles" not in text
    ok = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr                      # sdpa-math is right: the script passes
    broken = script.read_text().replace("return out.transpose(1, 2)", "return 0 * out.transpose(1, 2)")
    assert broken != text, "the repro must spell the backend call out"
    script.write_text(broken)
    bad = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 1 and "all-zero output" in bad.stdout


def test_known_bug_is_tallied_and_the_search_goes_on(tmp_path):
    """Zeros under causal are a known bug: a backend with only that bug runs its whole budget and reports nothing;
    one with a second bug (later batches wrong) still gets that one reported, and never the known one."""

    class ZeroCausal(Correct):
        name = "two-known"

        def run(self, case, t):
            return BROKEN["broken-zero-causal"]().run(case, t)

    class ZeroCausalAndBatch(ZeroCausal):
        def run(self, case, t):
            return BROKEN["broken-zero-causal" if case.causal else "broken-batch"]().run(case, t)

    corpus_io.save(tmp_path, _entry(backend="two-known", known_bug={"link": "https://example.org/2",
                                                                    "match": "every graded"}), repro=False)
    known = corpus_io.known_bugs(tmp_path)
    tally, findings = fuzz(ZeroCausal(), space=Space(max_len=40), settings=profile("ci", max_examples=300),
                           known=known)
    assert not findings and tally.labels["KNOWN:ALL_ZERO"] > 20 and tally.examples >= 300, tally.to_dict()
    _, findings = fuzz(ZeroCausalAndBatch(), space=Space(max_len=40), settings=profile("ci", max_examples=300),
                       known=known)
    # the batch bug is reported (TOLERANCE, or on probe inputs MASK_DROP / MASK_LEAK), the known one never
    assert findings and all(f.verdict.diagnosis != V.ALL_ZERO for f in findings), [f.verdict.label for f in findings]


def test_repro_script_checks_gradients_through_the_written_call(tmp_path):
    """A GRADIENT finding's script reruns the backward: a call whose forward is right and whose gradients are 1.5x
    (a planted bug) must fail it, the real call must pass it."""
    case = Case(sq=4, skv=6, h=2, hk=1, d_qk=8, d_v=8, dtype="bfloat16", causal=True, seed=3, grads=True)
    path = corpus_io.save(tmp_path, _entry(case=case, backend="sdpa-math"))
    script = path.with_suffix(".py")
    ok = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0 and "max |dk - float64|" in ok.stdout, ok.stdout + ok.stderr
    text = script.read_text()
    broken = text.replace("    return out.transpose(1, 2)",
                          "    out = out + 0.5 * (out - out.detach())  # same values, gradients x 1.5\n"
                          "    return out.transpose(1, 2)")
    assert broken != text
    script.write_text(broken)
    bad = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 1 and "max |dv - float64|" in bad.stdout and "> bound" in bad.stdout, bad.stdout


def test_cli_backends_lists_every_backend_with_why_not(capsys):
    assert main(["backends", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["sdpa-math"]["available"] and rows["sdpa-math"]["version"]
    assert not rows["fa4"]["available"] and rows["fa4"]["why_not"]


def test_cli_replay_isolate_reports_a_crashing_entry_and_goes_on(tmp_path, capsys):
    from attnfuzz.oracles.verdict import Verdict
    spec = "tests.misbehaving:segfault_when_causal"
    corpus_io.save(tmp_path, corpus_io.Entry(spec, Case(sq=4, skv=4, d_qk=8, d_v=8, causal=True),
                                             Verdict("CRASH", "SIGSEGV")), repro=False)
    corpus_io.save(tmp_path, corpus_io.Entry(spec, Case(sq=4, skv=4, d_qk=8, d_v=8), Verdict("FAIL", "TOLERANCE")),
                   repro=False)
    assert main(["replay", str(tmp_path), "--isolate", "--json"]) == 1  # the crash is a regression: not a known bug
    rows = json.loads(capsys.readouterr().out)
    assert [(r["outcome"], r["verdict"]) for r in rows] == [("fail", "CRASH:SIGSEGV"), ("pass", "PASS")]


def test_a_known_bug_can_be_narrowed_by_a_trait_field_equality_cannot_say(tmp_path):
    """TE fused's garbage dK for a sequence with no query: `when` names the trait, so the same label on a batch
    whose sequences all have queries is not swallowed as known."""
    empty_q = Case(b=2, sq=2, skv=2, d_qk=8, d_v=8, seqlens_q=(2, 0), seqlens_kv=(2, 2), grads=True)
    grads_fail = V.Verdict(V.FAIL, V.GRADIENT, "dk: diff_max=8.464e+03")
    corpus_io.save(tmp_path, _entry(case=empty_q, backend="te-fused", verdict=grads_fail,
                                    known_bug={"link": "https://example.org/te", "when": {"empty_q_sequence": True}}),
                   repro=False)
    known = corpus_io.known_bugs(tmp_path)
    assert known("te-fused", empty_q.replace(seqlens_q=(0, 1), seed=3), grads_fail) is not None
    assert known("te-fused", empty_q.replace(seqlens_q=(2, 1)), grads_fail) is None


def test_a_spelling_trait_takes_every_spelling_that_passes_the_sentinel(tmp_path):
    """FA4's (-1, 0) window read as an empty band (#2490) fails the same way through seqused (found on the H200 as
    'seqused+neg' while the entry named 'neg'): the trait takes both, and not the spellings without -1."""
    neg = Case(sq=2, skv=1, d_qk=8, d_v=8, dtype="float16", causal=True, spelling="neg")
    rows_zeroed = V.Verdict(V.FAIL, V.TOLERANCE, "out: diff_max=1.509e+00")
    corpus_io.save(tmp_path, _entry(case=neg, backend="fa4", verdict=rows_zeroed,
                                    known_bug={"link": "https://example.org/fa", "when": {"negative_bound": True}}),
                   repro=False)
    known = corpus_io.known_bugs(tmp_path)
    for spelling in ("neg", "causal+neg", "seqused+neg", "seqused+causal+neg"):
        assert known("fa4", neg.replace(spelling=spelling), rows_zeroed) is not None, spelling
    for spelling in ("", "window", "causal+window", "seqused+window", "wide"):
        assert known("fa4", neg.replace(spelling=spelling), rows_zeroed) is None, spelling


def test_a_known_bug_answers_to_the_other_labels_its_garbage_output_takes(tmp_path):
    """Compiled flex on AVX2 returns rows of 0, NaN or wrong values from one call to the next: one known bug, saved
    as TOLERANCE, takes the NONFINITE and ALL_ZERO failures of its shape too, and nothing else."""
    garbage = V.Verdict(V.FAIL, V.TOLERANCE, "out: diff_max=1.0")
    path = corpus_io.save(tmp_path, _entry(case=CASE.replace(skv=24), verdict=garbage), repro=False)
    assert main(["known", str(path), "--link", "l", "--label", "PASS"]) == 2
    assert main(["known", str(path), "--link", "l", "--label", "FAIL:NONFINITE", "--label", "FAIL:ALL_ZERO",
                 "--label", "FAIL:TOLERANCE", "--when", "kv_len_mod_16=8"]) == 0
    assert corpus_io.load(path).known_bug["labels"] == ["FAIL:ALL_ZERO", "FAIL:NONFINITE"]
    known = corpus_io.known_bugs(tmp_path)
    for label in (V.TOLERANCE, V.NONFINITE, V.ALL_ZERO):
        assert known("sdpa-math", CASE.replace(skv=40), V.Verdict(V.FAIL, label, "x")) is not None, label
    assert known("sdpa-math", CASE.replace(skv=40), V.Verdict(V.FAIL, V.GRADIENT, "x")) is None
    assert known("sdpa-math", CASE.replace(skv=32), V.Verdict(V.FAIL, V.NONFINITE, "x")) is None   # outside `when`


def test_the_lengths_differ_trait_looks_at_each_sequence():
    assert when_fields(Case(sq=4, skv=4))["lengths_differ"] is False
    assert when_fields(Case(sq=4, skv=5))["lengths_differ"] is True
    padded = Case(b=2, sq=4, skv=4, seqlens_q=(4, 2), seqlens_kv=(4, 3))
    assert when_fields(padded)["lengths_differ"] is True
    assert when_fields(padded.replace(seqlens_kv=(4, 2)))["lengths_differ"] is False


def test_the_query_tile_trait_counts_128_row_tiles_over_every_head():
    over = [when_fields(Case(b=3, h=8, hk=2, sq=n))["query_tiles_over_132"] for n in (640, 641)]   # 120, 144 tiles
    assert over == [False, True]
    packed = Case(b=2, h=44, hk=44, sq=129, skv=1, seqlens_q=(1, 129), seqlens_kv=(1, 1), layout="thd")
    assert when_fields(packed)["query_tiles_over_132"] is False   # thd tiles each sequence: 44 * (1 + 2) = 132
    assert when_fields(packed.replace(h=45, hk=45))["query_tiles_over_132"] is True


def test_the_key_length_trait_counts_the_keys_one_kernel_call_runs_over():
    fields = when_fields
    assert fields(Case(sq=2, skv=24))["kv_len_mod_16"] == 8
    assert fields(Case(b=2, sq=12, skv=24, seqlens_q=(12, 5), seqlens_kv=(10, 14)))["kv_len_mod_16"] == 8   # padded
    assert fields(Case(b=2, sq=12, skv=14, seqlens_q=(12, 5), seqlens_kv=(10, 14), layout="thd"))["kv_len_mod_16"] == 8
    assert fields(Case(sq=1, skv=448))["kv_len_mod_128"] == 64 and fields(Case(sq=1, skv=512))["kv_len_mod_128"] == 0
    assert [fields(Case(values=v))["very_negative_rows"] for v in ("far_negative", "anti_aligned", "ties")] == \
        [True, True, False]
    assert fields(Case(d_qk=16, d_v=32))["d_qk_at_most_16"] and not fields(Case(d_qk=32, d_v=16))["d_qk_at_most_16"]
    assert fields(Case(d_qk=128, d_v=136))["head_dim_over_128"] and not fields(Case(d_qk=128, d_v=128))["head_dim_over_128"]
    assert fields(Case(d_qk=64, d_v=40))["head_dim_off_32"] and fields(Case(d_qk=8, d_v=8))["head_dim_off_32"]
    assert not fields(Case(d_qk=32, d_v=96))["head_dim_off_32"]
    assert fields(Case(skv=40, page_size=1))["paged"] and not fields(Case(skv=40))["paged"]


def test_a_when_naming_neither_a_field_nor_a_trait_is_a_named_error(tmp_path):
    path = corpus_io.save(tmp_path, _entry(), repro=False)
    data = json.loads(path.read_text())
    data["known_bug"] = {"link": "https://example.org", "when": {"empty_queries": True}}
    path.write_text(json.dumps(data))
    with pytest.raises(corpus_io.CorpusError, match="empty_queries.*neither Case fields nor traits"):
        corpus_io.load(path)
    data["known_bug"] = None
    path.write_text(json.dumps(data))
    assert main(["known", str(path), "--link", "https://example.org", "--when", "empty_queries=true"]) == 2
    # a trait the entry's own case has (a `when` that leaves out the finding's own case is refused:
    # tests/test_known_precise.py)
    assert main(["known", str(path), "--link", "https://example.org", "--when", "causal_band=true"]) == 0
    assert corpus_io.load(path).known_bug["when"] == {"causal_band": True}


def test_run_log_keeps_the_whole_verdict_checks_and_all(tmp_path):
    """`attnfuzz run --log` writes each verdict whole, as a campaign does: its checks (per-tensor errors, and the
    slow-attempt line of an isolated case) are in the log, not just the label and the message."""
    corpus = tmp_path / "corpus"
    corpus_io.save(corpus, corpus_io.Entry("tests.misbehaving:zero_when_causal", CASE, FAIL,
                                           known_bug={"link": "https://example.org/z"}), repro=False)
    log = tmp_path / "run.jsonl"
    main(["run", "--backend", "tests.misbehaving:zero_when_causal", "--max-examples", "60", "--corpus", str(corpus),
          "--log", str(log), "--seed", "1"])
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert {r["label"] for r in rows} == {"PASS", "KNOWN:ALL_ZERO"}
    assert all(V.Verdict.from_dict(r["verdict"]).label == r["label"] for r in rows)
    assert all(any(c.startswith("out: ") and "diff_max=" in c for c in r["verdict"]["checks"]) for r in rows
               if r["label"] == "PASS")


def test_a_hang_entry_is_replayed_only_where_it_can_be_timed_out(tmp_path, capsys):
    """In-process nothing can stop a hang: without --isolate a HANG entry is skipped with the fix; with it, the
    worker times the case out and the entry fails as the regression it is."""
    hung = corpus_io.Entry("tests.misbehaving:hangs", Case(sq=2, skv=2, d_qk=8, d_v=8),
                           V.Verdict(V.HANG, "TIMEOUT", "no answer within 1s"))
    path = corpus_io.save(tmp_path, hung, repro=False)
    verdict = replay_io.replay(corpus_io.load(path))
    assert verdict.status == V.UNSUPPORTED and "--isolate" in verdict.message
    assert main(["replay", str(tmp_path), "--isolate", "--case-timeout", "1", "--json"]) == 1
    assert [r["verdict"] for r in json.loads(capsys.readouterr().out)] == ["HANG:TIMEOUT"]


def test_a_known_bug_that_now_fails_otherwise_says_what_it_was_saved_as(tmp_path, capsys):
    """A known bug replays as an expected failure whatever its label; when the label moved (a grader change, the
    bug changing, a second bug on the case) the replay says so instead of hiding it in the xfail."""
    moved = _entry(backend="tests.misbehaving:zero_when_causal", verdict=V.Verdict(V.FAIL, V.TOLERANCE, "x"),
                   known_bug={"link": "https://example.org/t"})
    same = _entry(backend="tests.misbehaving:zero_when_causal", case=CASE.replace(sq=4), known_bug={"link": "l"})
    for entry in (moved, same):
        corpus_io.save(tmp_path, entry, repro=False)
    assert main(["replay", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("xfail")]
    assert len(lines) == 2 and sum("FAIL:ALL_ZERO (saved as FAIL:TOLERANCE)" in line for line in lines) == 1, lines


def test_a_known_flaky_entry_answers_to_the_label_it_flaked_with(tmp_path):
    """A case fails as CRASH:EXIT_1; FLAKY is only what re-running the finding concluded. So a known FLAKY entry
    must match the failure it flaked with, or the fuzzer stops on it again (FA4's flaky exit, 2026-11-30)."""
    flaky = V.Verdict(V.FLAKY, "CRASH:EXIT_1", "did not reproduce on a second run: the worker died (EXIT_1)")
    corpus_io.save(tmp_path, _entry(backend="fa4", verdict=flaky, known_bug={"link": "l", "when": {"d_qk": 8}}),
                   repro=False)
    known = corpus_io.known_bugs(tmp_path)
    crash = V.Verdict(V.CRASH, "EXIT_1", "fa4: the worker process died (EXIT_1)")
    assert known("fa4", CASE, crash) is not None
    assert known("fa4", CASE, flaky) is not None
    assert known("fa4", CASE, V.Verdict(V.CRASH, "SIGSEGV", "died")) is None      # another label
    assert known("fa4", CASE.replace(d_qk=16, d_v=16), crash) is None             # outside its `when`


def test_a_known_flaky_entry_that_passes_once_is_not_called_fixed(tmp_path, capsys):
    """Passing once is no evidence that a flaky bug is gone: the replay says it did not come back, not that the
    known bug now passes (which it does say for a known bug that is not flaky)."""
    flaky = V.Verdict(V.FLAKY, "FAIL:ALL_ZERO", "FAIL:ALL_ZERO in 1 of 3 identical runs")
    corpus_io.save(tmp_path, _entry(backend="sdpa-math", verdict=flaky, known_bug={"link": "l"}), repro=False)
    assert main(["replay", str(tmp_path), "--json"]) == 0
    assert [r["outcome"] for r in json.loads(capsys.readouterr().out)] == ["unreproduced"]
    corpus_io.save(tmp_path, _entry(backend="sdpa-math", case=CASE.replace(sq=4), known_bug={"link": "l"}),
                   repro=False)
    assert main(["replay", str(tmp_path), "--json"]) == 1
    assert sorted(r["outcome"] for r in json.loads(capsys.readouterr().out)) == ["unreproduced", "xpass"]


def test_every_known_bug_in_the_corpus_matches_its_own_case():
    """A `when` or `match` that does not fit the entry's own case and message would make the entry useless while
    fuzzing (its bug never counted KNOWN): each known entry must answer for the failure it was saved from."""
    from pathlib import Path
    corpus = Path(__file__).resolve().parents[1] / "corpus"
    known = corpus_io.known_bugs(corpus)
    entries, errors = corpus_io.load_all(corpus)
    assert not errors
    unmatched = [path.name for path, entry in entries
                 if entry.known_bug and known(entry.backend, entry.case, entry.verdict) is None]
    assert not unmatched, unmatched


# -- entries recorded under a CPU vector ISA -------------------------------------------------------------------------
def test_a_stopped_run_keeps_the_smallest_failing_case_of_each_label(tmp_path):
    """A time limit mid-shrink saves each label's failure as far as the shrink had taken it: the smallest failing case
    graded (by the oracle's work), not the first, which is the largest a shrink starts from."""
    zero = V.Verdict(V.FAIL, V.ALL_ZERO, "all zero")
    nan = V.Verdict(V.FAIL, V.NONFINITE, "nan")
    as_found = corpus_io.AsFound("sdpa-math", "cpu")
    first = Case(b=3, sq=40, skv=50, h=4, hk=2, d_qk=64, d_v=64, causal=True)
    shrunk = first.replace(b=1, sq=2, skv=3, h=1, hk=1)
    for case, verdict in [(first, zero), (first.replace(b=2), zero), (shrunk, zero), (first.replace(sq=30), zero),
                          (shrunk.replace(seed=1), zero), (first, nan), (Case(sq=1, skv=1), V.Verdict(V.PASS, None, ""))]:
        as_found.see(case, verdict)
    assert as_found.failures == {"FAIL:ALL_ZERO": (shrunk, zero), "FAIL:NONFINITE": (first, nan)}
    said = as_found.save(tmp_path, corpus_io.STOPPED_UNCONFIRMED)
    assert len(said) == 2 and all("attnfuzz shrink" in s and "UNCONFIRMED" in s for _, s in said), said
    assert {corpus_io.load(p).case for p in tmp_path.glob("*.json")} == {shrunk, first}
    assert {p for p, _ in said} == set(tmp_path.glob("*.json"))


def test_as_found_besides_keeps_only_the_labels_no_finding_reports():
    """What a --first-bug run saves unshrunk: a label is reported by a finding of that label, by a FLAKY finding
    found with it, or as one a finding attached (the same root cause)."""
    as_found = corpus_io.AsFound("sdpa-math", "cpu")
    case = Case(sq=3, skv=3, causal=True)
    labels = {name: V.Verdict(V.FAIL, name, name) for name in (V.ALL_ZERO, V.NONFINITE, V.TOLERANCE, V.GRADIENT)}
    for verdict in labels.values():
        as_found.see(case, verdict)
    flaky = Finding("sdpa-math", case, V.Verdict(V.FLAKY, "FAIL:TOLERANCE", "2 of 4"))
    zero = Finding("sdpa-math", case, labels[V.ALL_ZERO])
    zero.attached = [(case, labels[V.NONFINITE])]
    assert set(as_found.besides([zero, flaky]).failures) == {"FAIL:GRADIENT"}
    assert set(as_found.besides([]).failures) == set(as_found.failures)
