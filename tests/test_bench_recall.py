"""bench/recall.py against a planted kernel: a held-out record the kernel's failure matches is found in every seed,
one it cannot match is not found within a small budget, what the held-out group holds, and bad input."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnfuzz.oracles import verdict as V
from attnfuzz.store import corpus as corpus_io
from attnfuzz.strategies.case import Case

REPO = Path(__file__).resolve().parents[1]
SPEC = "tests.misbehaving:zero_when_causal"   # all zeros whenever the case is causal
ENTRY = corpus_io.Entry(SPEC, Case(sq=4, skv=6, d_qk=8, d_v=8, causal=True, seed=2),
                        V.Verdict(V.FAIL, V.ALL_ZERO, "every graded output element is 0"),
                        known_bug={"link": "https://example.org/zeros", "match": "every graded output element is 0"},
                        kernel_path=str(REPO))


def _recall(corpus: Path, *options: str) -> dict:
    ran = subprocess.run([sys.executable, str(REPO / "bench" / "recall.py"), "--corpus", str(corpus), "--json",
                          *options], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return json.loads(ran.stdout)


def test_a_planted_bug_is_found_blind_and_a_record_it_cannot_match_is_not(tmp_path):
    found = corpus_io.save(tmp_path, ENTRY, repro=False)
    never = corpus_io.save(tmp_path, dataclasses.replace(   # an LSE bug: this kernel returns no LSE to get wrong
        ENTRY, verdict=V.Verdict(V.FAIL, V.LSE, "lse: got=-0.27 expected=-0.19"),
        known_bug={"link": "https://example.org/lse", "match": "lse"}), repro=False)
    out = _recall(tmp_path, "--seeds", "1", "--budget-cases", "30", "--budget-s", "60")
    assert out["held_out"] == {found.name: [found.name], never.name: [never.name]}
    entries = out["builds"]["here"]["entries"]
    hit, miss = entries[found.name], entries[never.name]   # (one seed each: the test's time)
    assert hit["found"] == 1 and hit["recalled"], hit
    assert all(r["matched"] == found.stem and r["label"] == "FAIL:ALL_ZERO" and r["cases"] <= 30 for r in hit["runs"])
    assert hit["median_cases"] == sorted(r["cases"] for r in hit["runs"])[0]
    # the unmatched record is searched to the end of its budget (the planted bug, known there, passed over)
    assert miss["found"] == 0 and not miss["recalled"] and miss["median_seconds"] is None, miss
    assert all(r["cases_run"] == 30 and "error" not in r for r in miss["runs"]), miss
    # what it graded instead: the planted bug, known there, passed over; passing and refused cases
    assert all(sum(r["statuses"].values()) == 30 and r["statuses"].get("KNOWN") for r in miss["runs"]), miss
    assert out["builds"]["here"]["recalled"] == 1 and out["builds"]["here"]["run"] == 2
    assert out["builds"]["here"]["median_cases"] == hit["median_cases"]   # over the recalled entries only


def test_an_entry_whose_case_no_longer_fails_here_is_not_run(tmp_path):
    """An entry whose saved case the kernel now passes (its bug fixed in this stack) is not searched for: listed as not
    run, with why; one whose case still fails is. --replays 0 searches for both."""
    fails = corpus_io.save(tmp_path, ENTRY, repro=False)
    fixed = corpus_io.save(tmp_path, dataclasses.replace(   # the kernel is right on non-causal cases
        ENTRY, case=ENTRY.case.replace(causal=False, seed=3), known_bug={**ENTRY.known_bug, "note": "fixed"}),
        repro=False)
    out = _recall(tmp_path, "--seeds", "1", "--budget-cases", "5", "--budget-s", "60")
    assert out["not_run"] == {fixed.name: "does not fail here: its case passed 3 replay(s)"}, out["not_run"]
    assert list(out["builds"]["here"]["entries"]) == [fails.name]
    everything = _recall(tmp_path, "--seeds", "1", "--budget-cases", "5", "--budget-s", "60", "--replays", "0")
    assert everything["not_run"] == {} and len(everything["builds"]["here"]["entries"]) == 2


def test_a_backends_replays_are_shared_between_the_replay_processes(monkeypatch):
    """Nine entries of one backend and one of another: four processes replay at most three each, every entry once,
    each process one backend's."""
    monkeypatch.syspath_prepend(str(REPO))
    from bench.recall_replay import spread
    nine, one = [f"a{i}" for i in range(9)], ["b0"]
    batches = spread([nine, one], ways=4)
    assert max(map(len, batches)) == 3 and sorted(sum(batches, [])) == sorted(nine + one)
    assert all(len({name[0] for name in batch}) == 1 for batch in batches)
    assert spread([["a0"]], ways=4) == [["a0"]]


def test_failures_no_held_out_record_takes_are_counted_by_label(tmp_path):
    """With only the LSE record in the corpus, the planted kernel's all-zero failures are taken by no record: the
    seed that searched in vain says so, by label, as a new bug or a record narrower than its bug would show."""
    never = corpus_io.save(tmp_path, dataclasses.replace(
        ENTRY, verdict=V.Verdict(V.FAIL, V.LSE, "lse: got=-0.27 expected=-0.19"),
        known_bug={"link": "https://example.org/lse", "match": "lse"}), repro=False)
    out = _recall(tmp_path, "--seeds", "1", "--budget-cases", "20", "--budget-s", "60", "--replays", "0")
    run, = out["builds"]["here"]["entries"][never.name]["runs"]
    assert not run["found"] and set(run["unmatched"]) == {"FAIL:ALL_ZERO"} and run["unmatched"]["FAIL:ALL_ZERO"] >= 1
    assert run["statuses"]["FAIL"] == run["unmatched"]["FAIL:ALL_ZERO"], run
    example = run["unmatched_examples"]["FAIL:ALL_ZERO"]   # the smallest such case, to look at
    assert Case.from_dict(example["case"]).causal and 1 <= example["cases"] <= 20, example
    assert example["message"], example


def test_seeds_run_at_once_report_each_seed_in_order(tmp_path):
    found = corpus_io.save(tmp_path, ENTRY, repro=False)
    out = _recall(tmp_path, "--seeds", "3", "--jobs", "3", "--budget-cases", "30", "--budget-s", "60")
    hit = out["builds"]["here"]["entries"][found.name]
    assert [r["seed"] for r in hit["runs"]] == [1, 2, 3] and hit["found"] == 3, hit
    assert out["settings"]["jobs"] == 3


def test_a_record_that_answers_for_the_held_out_failure_is_held_out_with_it(tmp_path):
    """A second record that matches the entry's saved failure would mark the bug KNOWN: it is a duplicate. The
    second record here is a broader one of the same failure (no match string)."""
    spec = importlib.util.spec_from_file_location("recall", REPO / "bench" / "recall.py")
    recall = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recall)
    first = corpus_io.save(tmp_path, ENTRY, repro=False)
    broad = corpus_io.save(tmp_path, dataclasses.replace(ENTRY, case=ENTRY.case.replace(sq=3), known_bug={
        "link": "https://example.org/other"}), repro=False)
    other_backend = corpus_io.save(tmp_path, dataclasses.replace(ENTRY, backend="tests.misbehaving:nan_when_long"),
                                   repro=False)
    plan = recall.plan(str(tmp_path), "cpu", [first.name])
    ran = {name: {k: v for k, v in what.items() if k != "isa"} for name, what in plan["run"].items()}  # the ISA
    assert ran == {first.name: {"backend": SPEC, "held_out": sorted([first.name, broad.name]),  # is the host's
                                "kernel_path": str(REPO)}}
    assert other_backend.name not in plan["run"][first.name]["held_out"]
    assert "error" in recall.plan(str(tmp_path), "cpu", ["no-such-entry*"])


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for options in (["A=" + str(tmp_path / "missing")], ["--corpus", str(tmp_path / "no")], ["--seeds", "0"],
                    ["--jobs", "0"], ["--replays", "-1"]):
        ran = subprocess.run([sys.executable, str(REPO / "bench" / "recall.py"), *options], capture_output=True,
                             text=True, timeout=60)
        assert ran.returncode == 2 and len(ran.stderr.strip().splitlines()) == 1, (options, ran.stderr)


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                    reason="an x86 CPU with AVX2 runs torch's AVX2 kernels; this one does not")
def test_an_entry_recorded_under_avx2_is_searched_under_avx2(tmp_path):
    """A bug that shows only under AVX2 is found on an AVX-512 CPU too: the seed runs under the ISA its entry
    recorded (ATEN_CPU_CAPABILITY=avx2); without it, this search would pass every case there."""
    entry = dataclasses.replace(ENTRY, backend="tests.misbehaving:zero_when_avx2",
                                environment={"cpu_capability": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"})
    saved = corpus_io.save(tmp_path, entry, repro=False)
    out = _recall(tmp_path, "--seeds", "1", "--budget-cases", "30", "--budget-s", "60")
    assert out["isa"] == {saved.name: "avx2"}
    hit = out["builds"]["here"]["entries"][saved.name]
    assert hit["found"] == 1 and hit["runs"][0]["label"] == "FAIL:ALL_ZERO", hit


def _recall_module():
    spec = importlib.util.spec_from_file_location("recall", REPO / "bench" / "recall.py")
    recall = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recall)
    return recall


def test_every_build_is_judged_by_the_first_builds_records(tmp_path):
    """A seed prints each failure it meets and this process matches it: an older build's case (fewer fields) is
    matched by today's record, another failure is not, and a field this build does not know is no match."""
    recall = _recall_module()
    entry = corpus_io.save(tmp_path, ENTRY, repro=False)
    judge = recall.judges(str(tmp_path), {entry.name: {"backend": SPEC, "held_out": [entry.name]}})[entry.name]
    older = {k: v for k, v in ENTRY.case.to_dict().items() if k in ("b", "sq", "skv", "d_qk", "d_v", "causal", "seed")}
    hit = judge({"case": older, "verdict": ENTRY.verdict.to_dict(), "cases": 7, "seconds": 1.5})
    assert hit == {"found": True, "matched": entry.stem, "label": "FAIL:ALL_ZERO", "cases": 7, "seconds": 1.5}
    other = V.Verdict(V.FAIL, V.TOLERANCE, "out: diff_max=1")
    assert judge({"case": older, "verdict": other.to_dict(), "cases": 8, "seconds": 2.0}) is None
    assert judge({"case": {**older, "a_later_field": 1}, "verdict": ENTRY.verdict.to_dict(), "cases": 9,
                  "seconds": 2.5}) is None


def test_together_one_process_a_seed_finds_each_held_out_entry_of_the_backend(tmp_path):
    """--together: the planted kernel's all-zero bug and an LSE record (two entries of one backend) are searched by
    one process a seed, each held out; the all-zero bug is found, and a record no failure matches stays not found,
    the seed running to its budget for it."""
    zeros = corpus_io.save(tmp_path, ENTRY, repro=False)
    never = corpus_io.save(tmp_path, dataclasses.replace(
        ENTRY, verdict=V.Verdict(V.FAIL, V.LSE, "lse: got=-0.27 expected=-0.19"),
        known_bug={"link": "https://example.org/lse", "match": "lse"}), repro=False)
    out = _recall(tmp_path, "--seeds", "2", "--budget-cases", "40", "--budget-s", "60", "--together")
    table = out["builds"]["here"]["entries"]
    assert table[zeros.name]["found"] == 2 and table[never.name]["found"] == 0, table
    assert [r["seed"] for r in table[never.name]["runs"]] == [1, 2]
    assert all(r["cases_run"] == 40 for r in table[never.name]["runs"]), table[never.name]
    # the all-zero bug, once met, is passed over as known: no shrink ends the first Hypothesis run, nor is it news
    assert all(r["rounds"] == 1 and "unmatched" not in r for r in table[never.name]["runs"]), table[never.name]
    assert out["processes"] == 2   # one a seed; entry by entry, one an entry and a seed:
    assert _recall(tmp_path, "--seeds", "2", "--budget-cases", "5", "--budget-s", "60")["processes"] == 4


def test_each_backend_is_asked_whether_it_runs_in_a_process_of_its_own(tmp_path):
    """Two kernels whose modules cannot load into one process (tests/stacks): both entries are run, as each loads
    alone; asked in one process, the second would be left out as unavailable."""
    recall = _recall_module()
    for name in ("a", "b"):
        corpus_io.save(tmp_path, dataclasses.replace(ENTRY, backend=f"tests.stacks.stack_{name}:kernel"), repro=False)
    chosen = recall.plan(str(tmp_path), "cpu", [])
    assert chosen["not_run"] == {} and len(chosen["run"]) == 2, chosen
    with pytest.raises(ImportError, match="cannot load beside"):   # the control: one process cannot hold both
        importlib.import_module("tests.stacks.stack_a")
        importlib.import_module("tests.stacks.stack_b")


def test_a_child_imports_attnfuzz_from_its_build_and_keeps_the_rest_of_pythonpath(tmp_path):
    """A build's child puts its folder first and keeps PYTHONPATH's other folders (a GPU runner's stack lives
    there: dropping it left every FA4, TE and FlashInfer entry unavailable); with no build, the environment as is."""
    from bench.recall_child import child_env
    env = child_env(tmp_path, {"PYTHONPATH": f"/stack/site{os.pathsep}/other", "HOME": "/h"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/stack/site", "/other"]
    assert env["PYTHONNOUSERSITE"] == "1" and env["HOME"] == "/h"
    assert child_env(tmp_path, {})["PYTHONPATH"] == str(tmp_path)
    assert child_env(None, {"PYTHONPATH": "/stack/site"}) == {"PYTHONPATH": "/stack/site"}


def test_the_tables_say_what_was_searched_how_and_what_was_not_run():
    from bench.recall_report import show_all, summarize
    runs = {"a.json": [{"seed": 1, "found": True, "matched": "a", "cases": 3, "seconds": 1.5}]}
    chosen = {"run": {"a.json": {"backend": "x", "held_out": ["a.json", "b.json"], "isa": "avx2"}},
              "not_run": {"c.json": "backend unavailable: no GPU"}}
    runs["b.json"] = [{"seed": 1, "found": False, "cases_run": 9, "statuses": {"PASS": 7, "FAIL": 2},
                       "unmatched": {"FAIL:LSE": 2}}]
    chosen["run"]["b.json"] = {"backend": "x", "held_out": ["b.json"]}
    text = show_all({"here": summarize(runs, 1)}, chosen, "cpu")
    assert "seed 1: 9 cases (FAIL 2, PASS 7), taken by no held-out record: FAIL:LSE x2" in text, text
    assert "smallest" not in text and "unrun" not in text   # no example kept, no case answered unrun: none shown
    runs["b.json"][0]["unrun"] = 1
    assert "(FAIL 2, PASS 7, 1 of them answered unrun)" in show_all({"here": summarize(runs, 1)}, chosen, "cpu")
    runs["b.json"][0]["unmatched_examples"] = {"FAIL:LSE": {"case": Case(sq=3, skv=5).to_dict(), "cases": 4,
                                                            "message": "lse: got=1 expected=2"}}
    runs["a.json"].append({**runs["b.json"][0], "seed": 1})   # the same seed's example under another entry: once
    text = show_all({"here": summarize(runs, 1)}, chosen, "cpu")
    assert text.count("smallest FAIL:LSE") == 1, text
    assert "at case 4: Case(sq=3, skv=5): lse: got=1 expected=2" in text, text
    assert "[here]" in text and "1 of 2 entries" in text and "median cases: 3" in text, text
    assert "found by any seed: 1 of 2 entries" in text, text
    assert "a.json: searched under ATEN_CPU_CAPABILITY=avx2" in text and "a.json: held out with b.json" in text
    assert "c.json: not run: backend unavailable: no GPU" in text
    assert show_all({}, {"run": {}, "not_run": {}}, "cuda") == "no entry can run on cuda"


def test_an_entry_one_seed_of_three_found_is_found_by_the_machine_but_not_recalled():
    """Seeds run at once are one machine's lanes: the machine found what one of them found, while recall asks for
    at least half the seeds."""
    from bench.recall_report import summarize
    rows = [{"seed": 1, "found": True, "matched": "x", "cases": 9, "seconds": 40.0},
            {"seed": 2, "found": False, "cases_run": 50}, {"seed": 3, "found": False, "cases_run": 60}]
    summary = summarize({"x.json": rows, "y.json": [{**r, "found": False} for r in rows]}, 3)
    assert summary["recalled"] == 0 and summary["found_by_any"] == 1 and summary["run"] == 2, summary
    two = summarize({"x.json": rows[:2] + [{**rows[0], "seed": 3}]}, 3)
    assert two["recalled"] == 1 and two["found_by_any"] == 1, two


def test_a_held_out_crash_once_met_is_answered_unrun_for_the_rest_of_the_search(tmp_path):
    """--together with a kernel that segfaults on every causal case: the crash record, held out, is matched at its
    first crash; after that most of its cases are answered without a new worker, as a run answers a known crash,
    while the search for the other held-out entry (an LSE bug it cannot show) goes on to its budget."""
    crash = corpus_io.save(tmp_path, corpus_io.Entry(
        "tests.misbehaving:segfault_when_causal", ENTRY.case,
        V.Verdict(V.CRASH, "SIGSEGV", "the worker process died (SIGSEGV) while running this case"),
        known_bug={"link": "tests/misbehaving.py", "note": "segfaults on causal cases", "when": {"causal": True}},
        kernel_path=str(REPO)), repro=False)
    never = corpus_io.save(tmp_path, corpus_io.Entry(
        "tests.misbehaving:segfault_when_causal", ENTRY.case.replace(causal=False),
        V.Verdict(V.FAIL, V.LSE, "lse: got=-0.27 expected=-0.19"),
        known_bug={"link": "https://example.org/lse", "match": "lse"}, kernel_path=str(REPO)), repro=False)
    out = _recall(tmp_path, "--seeds", "1", "--budget-cases", "60", "--budget-s", "100", "--together",
                  "--replays", "0")
    table = out["builds"]["here"]["entries"]
    assert table[crash.name]["found"] == 1 and table[crash.name]["runs"][0]["label"] == "CRASH:SIGSEGV", table
    run, = table[never.name]["runs"]
    assert not run["found"] and run["cases_run"] == 60, run
    # causal cases after the match: most answered unrun (one in CHECK_EVERY still runs), all known
    assert run["unrun"] >= 2 and run["statuses"]["KNOWN"] > run["unrun"], run
