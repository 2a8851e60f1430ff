"""`attnfuzz triage`: which known bug takes each logged failure, and which failures none takes."""

from __future__ import annotations

import json

from attnfuzz.store import caselog
from attnfuzz.store import corpus as corpus_io
from attnfuzz.cli import main
from attnfuzz.report.triage import triage
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

ZERO = V.Verdict(V.FAIL, V.ALL_ZERO, "every graded output element is 0")
SHORT, LONG = Case(sq=2, skv=2, d_qk=8, d_v=8, causal=True), Case(sq=80, skv=80, d_qk=8, d_v=8, causal=True)


def _log(path, rows):
    path.write_text("".join(caselog.record("b", case, v, 0.01, verdict=v.to_dict()) for case, v in rows))
    return path


def test_each_failure_goes_to_the_entry_that_takes_it_and_the_rest_are_new(tmp_path):
    corpus = tmp_path / "corpus"
    corpus_io.save(corpus, corpus_io.Entry("b", LONG, ZERO, known_bug={"link": "l", "when": {"sq_over_64": True}}),
                   repro=False)
    known = V.Verdict(V.KNOWN, V.ALL_ZERO, ZERO.message)             # the log says KNOWN, not FAIL
    log = _log(tmp_path / "run.jsonl", [(LONG, known), (LONG.replace(seed=3), ZERO), (SHORT, ZERO),
                                        (SHORT, V.Verdict(V.PASS, None, "")),
                                        (SHORT, V.Verdict(V.CRASH, "EXIT_1", "died"))])
    result = triage([log], corpus)
    [(name, taken)] = result["taken"].items()
    assert name.startswith("b-FAIL-ALL_ZERO") and taken["cases"] == 2 and len(taken["shapes"]) == 1
    assert {label: slot["cases"] for label, slot in result["untaken"].items()} == {"b FAIL:ALL_ZERO": 1,
                                                                                  "b CRASH:EXIT_1": 1}


def test_the_command_exits_1_while_some_failure_is_taken_by_no_known_bug(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus_io.save(corpus, corpus_io.Entry("b", SHORT, ZERO, known_bug={"link": "l"}), repro=False)
    (tmp_path / "campaign" / "cases").mkdir(parents=True)
    _log(tmp_path / "campaign" / "cases" / "lane0.jsonl", [(LONG, ZERO)])
    assert main(["triage", str(tmp_path / "campaign"), "--corpus", str(corpus), "--json"]) == 0  # `when` is empty
    assert json.loads(capsys.readouterr().out)["untaken"] == {}
    entry = next(corpus.glob("*.json"))
    data = json.loads(entry.read_text())
    data["known_bug"]["when"] = {"sq": 2}                                 # narrowed: the long case comes out
    entry.write_text(json.dumps(data))
    assert main(["triage", str(tmp_path / "campaign"), "--corpus", str(corpus)]) == 1
    assert "| b FAIL:ALL_ZERO | 1 |" in capsys.readouterr().out
    assert main(["triage", str(tmp_path / "missing"), "--corpus", str(corpus)]) == 2


def test_a_campaign_report_says_which_known_bug_took_its_failures(tmp_path):
    from attnfuzz.report.build import build_report
    known = tmp_path / "known"
    corpus_io.save(known, corpus_io.Entry("b", LONG, ZERO, known_bug={"link": "l", "when": {"sq_over_64": True}}),
                   repro=False)
    camp = tmp_path / "camp"
    (camp / "cases").mkdir(parents=True)
    _log(camp / "cases" / "lane0.jsonl", [(LONG, V.Verdict(V.KNOWN, V.ALL_ZERO, ZERO.message)),
                                          (LONG.replace(sq=90, skv=90), V.Verdict(V.KNOWN, V.ALL_ZERO, ZERO.message)),
                                          (SHORT, ZERO)])
    (camp / "campaign.json").write_text(json.dumps({"backends": ["b"], "device": "cpu", "known": str(known)}))
    markdown = build_report(camp).with_name("report.md").read_text()
    section = markdown.split("Known bugs by corpus entry")[1]
    row = next(line for line in section.splitlines() if line.startswith("| b-FAIL-ALL_ZERO"))
    assert row.split(" | ")[1:3] == ["2", "2"], row                 # two cases of two shapes; SHORT is its own finding
    (camp / "campaign.json").write_text(json.dumps({"backends": ["b"], "device": "cpu"}))
    assert "Known bugs by corpus entry" not in build_report(camp).with_name("report.md").read_text()
