"""bench/record_reach.py: the share of a log's cases that meet each known record's condition, graded or not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from attnfuzz.oracles import verdict as V
from attnfuzz.store import caselog
from attnfuzz.store import corpus as corpus_io
from attnfuzz.strategies.case import Case

BENCH = Path(__file__).resolve().parents[1] / "bench" / "record_reach.py"


def test_each_records_condition_is_counted_on_the_cases_that_meet_it(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    causal = corpus_io.save(corpus, corpus_io.Entry("sdpa-math", Case(sq=2, skv=2, causal=True), V.Verdict(
        V.FAIL, V.TOLERANCE, "x"), known_bug={"link": "https://example.org/c", "when": {"causal": True}}), repro=False)
    corpus_io.save(corpus, corpus_io.Entry("sdpa-math", Case(sq=3, skv=3), V.Verdict(V.FAIL, V.LSE, "y"),
                                           known_bug={"link": "https://example.org/any"}), repro=False)  # no when
    log = tmp_path / "run.jsonl"
    rows = [(Case(sq=4, skv=4, causal=True), V.Verdict(V.PASS, None, "")),
            (Case(sq=5, skv=5, causal=True), V.Verdict(V.UNSUPPORTED, None, "refused")),
            (Case(sq=6, skv=6), V.Verdict(V.PASS, None, "")),
            (Case(sq=7, skv=7), V.Verdict(V.PASS, None, ""))]
    log.write_text("".join(caselog.record("sdpa-math", c, v, 0.01) for c, v in rows)
                   + caselog.record("sdpa-flash", Case(causal=True), V.Verdict(V.PASS, None, ""), 0.01)
                   + json.dumps({"backend": "sdpa-math", "label": "PASS", "case": {"sq": 1, "later": 1}}) + "\n")
    ran = subprocess.run([sys.executable, str(BENCH), str(log), "--corpus", str(corpus), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    math = json.loads(ran.stdout)[str(log)]["sdpa-math"]
    assert math["cases"] == 4 and math["unreadable"] == 1
    assert math["records"] == {causal.stem: {"when": {"causal": True}, "met": 2, "graded": 1}}
    assert set(json.loads(ran.stdout)[str(log)]) == {"sdpa-math"}, "a backend without records is left out"
    bad = subprocess.run([sys.executable, str(BENCH), str(tmp_path / "none")], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "none" in bad.stderr


def test_drawn_cases_are_measured_and_a_gradient_record_needs_gradients(tmp_path):
    """--draw measures the cases `attnfuzz run` would draw for a backend, without a log; a record whose labels are
    all GRADIENT is met only by cases with gradients, whatever its `when` says."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    causal = corpus_io.save(corpus, corpus_io.Entry("sdpa-math", Case(sq=2, skv=2, causal=True), V.Verdict(
        V.FAIL, V.TOLERANCE, "x"), known_bug={"link": "https://example.org/c", "when": {"causal": True}}), repro=False)
    grad = corpus_io.save(corpus, corpus_io.Entry("sdpa-math", Case(sq=2, skv=2, causal=True, grads=True), V.Verdict(
        V.FAIL, V.GRADIENT, "dq"), known_bug={"link": "https://example.org/g", "when": {"causal": True}}), repro=False)
    ran = subprocess.run([sys.executable, str(BENCH), "--draw", "sdpa-math", "--cases", "200", "--corpus",
                          str(corpus), "--json"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    (source, result), = json.loads(ran.stdout).items()
    assert source == "sdpa-math: 200 drawn on cpu"
    records = result["sdpa-math"]["records"]
    assert result["sdpa-math"]["cases"] == 200
    assert records[grad.stem]["when"] == {"causal": True, "grads": True}
    assert 0 < records[grad.stem]["met"] < records[causal.stem]["met"] < 200, records
    for bad in (["--draw", "no-such-backend"], [], ["--draw", "sdpa-math", "--cases", "0"]):
        ran = subprocess.run([sys.executable, str(BENCH), *bad, "--corpus", str(corpus)], capture_output=True,
                             text=True, timeout=120)
        assert ran.returncode == 2 and len(ran.stderr.strip().splitlines()) == 1, (bad, ran.stderr)
