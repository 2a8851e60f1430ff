"""The campaign report, on a campaign directory written by the real fuzz loop (sdpa-math and a planted bug)."""

from __future__ import annotations

import argparse
import json
import struct
import time
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from attnfuzz.store import caselog
from attnfuzz.store import corpus as corpus_io
from attnfuzz.backends import get
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.report.build import add_parser, build_report, cmd_report, read_campaign
from attnfuzz.report.plots import plot_coverage, plot_ratios
from attnfuzz.report.coverage import Coverage
from attnfuzz.oracles.verdict import Verdict
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space
from tests.broken import ZeroWhenCausal

NASTY = '<script>alert("x")</script> & | pipes'
LINK = "https://example.org/bug?id=1&kind=<zero>"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _line(backend: str, case: Case, verdict: Verdict, lane: int | None, seconds: float = 0.01) -> str:
    ratio = verdict.ratio if verdict.ratio == verdict.ratio and abs(verdict.ratio) != float("inf") else str(
        verdict.ratio)
    row = {"backend": backend, "label": verdict.label, "ratio": ratio, "message": verdict.message[:300],
           "seconds": round(seconds, 4), "case": case.to_dict()}
    if lane is not None:
        row.update(lane=lane, time=time.time())
    return json.dumps(row) + "\n"


def fuzz_to_log(backend, path: Path, lane: int | None, examples: int = 30) -> tuple[Counter, list]:
    """Fuzz `backend` briefly, writing one line per case as the campaign does; returns the labels written."""
    labels, last = Counter(), [time.perf_counter()]
    with path.open("a") as f:
        def on_case(case, verdict, tally):
            now = time.perf_counter()
            f.write(_line(backend.name, case, verdict, lane, now - last[0]))
            labels[verdict.label] += 1
            last[0] = now
        _, findings = fuzz(backend, space=Space(max_len=40), settings=profile("ci", max_examples=examples),
                           on_case=on_case)
    return labels, findings


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """A campaign dir as fuzz/campaign/lane.py writes it: two lanes, a hand-written refusal with HTML in its reason, a truncated
    last line, the lanes' state, and the planted bug's findings saved in corpus/ (one marked known)."""
    root = tmp_path_factory.mktemp("campaign")
    (root / "cases").mkdir()
    (root / "state").mkdir()
    math_backend, broken = get("sdpa-math", "cpu"), ZeroWhenCausal()
    (root / "campaign.json").write_text(json.dumps({
        "backends": ["sdpa-math", broken.name], "skipped": {"fa4": "needs CUDA"}, "device": "cpu", "lanes": 2,
        "hours": 0.01, "seed": 0,
        "db": str(root / "db"), "started": "2026-12-01T00:00:00+00:00", "versions": {"sdpa-math": "torch-test"}}))
    expected = {}
    expected["sdpa-math"], _ = fuzz_to_log(math_backend, root / "cases" / "lane0.jsonl", 0)
    expected[broken.name], findings = fuzz_to_log(broken, root / "cases" / "lane1.jsonl", 1)
    with (root / "cases" / "lane0.jsonl").open("a") as f:
        f.write(_line("sdpa-math", Case(dtype="float64"), Verdict("UNSUPPORTED", None, NASTY), 0))
    expected["sdpa-math"]["UNSUPPORTED"] += 1
    with (root / "cases" / "lane1.jsonl").open("a") as f:
        f.write('{"backend": "broken-zero-causal", "label": "PA')          # a killed process's last line
    for lane, (name, labels) in enumerate(expected.items()):
        progress = {name: {"rounds": 1, "cases": sum(labels.values()), "examples": sum(labels.values()) + 7,
                           "seconds": 1.5}}  # 7 examples answered from the log
        (root / "state" / f"lane{lane}.json").write_text(json.dumps({"elapsed": 2.0, "backends": progress}))
    assert findings, "the planted bug must give a finding to save"
    for i, f in enumerate(findings):
        entry = corpus_io.Entry(backend=broken.name, case=f.case, verdict=f.verdict,
                                known_bug={"link": LINK, "note": "planted"} if i == 0 else None)
        corpus_io.save(root / "corpus", entry)
    index = build_report(root)
    return root, expected, findings, index


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.images, self.links, self.text = Counter(), [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] += 1
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        if tag == "a":
            self.links.append(attrs["href"])

    def handle_data(self, data):
        self.text.append(data)


def parse(index: Path) -> Page:
    page = Page()
    page.feed(index.read_text())
    page.close()
    return page


def assert_valid_png(path: Path, min_bytes: int = 8000) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    width, height = struct.unpack(">II", data[16:24])         # IHDR follows the magic and its chunk header
    assert width >= 300 and height >= 150 and len(data) >= min_bytes, (path, width, height, len(data))


def table_rows(markdown: str, title: str) -> dict[str, list[str]]:
    section = markdown.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| ")]
    return {row[0].strip(): [c.strip() for c in row] for row in rows[1:]}


def test_fixture_holds_what_the_report_must_show(campaign):
    _, expected, findings, _ = campaign
    assert expected["broken-zero-causal"]["FAIL:ALL_ZERO"] > 0
    assert expected["sdpa-math"]["PASS"] >= 20
    assert any(f.verdict.label == "FAIL:ALL_ZERO" for f in findings)


def test_totals_in_the_markdown_match_the_lines_written(campaign):
    root, expected, _, index = campaign
    markdown = (index.parent / "report.md").read_text()
    rows = table_rows(markdown, "Totals per backend")
    assert set(rows) == set(expected)
    for name, labels in expected.items():
        row = rows[name]
        count = lambda *statuses: sum(n for k, n in labels.items() if k.split(":")[0] in statuses)  # noqa: E731
        assert row[2:8] == [str(sum(labels.values())), str(count("PASS")), str(count("FAIL")), str(count("KNOWN")),
                            str(count("CRASH", "HANG", "FLAKY")), str(count("UNSUPPORTED"))], (name, row, labels)
    assert rows["sdpa-math"][1] == "torch-test"
    failures = table_rows(markdown, "Failures by label")
    assert failures["broken-zero-causal"][1:] == ["FAIL:ALL_ZERO", str(expected["broken-zero-causal"]["FAIL:ALL_ZERO"])]


def test_progress_and_settings_are_shown(campaign):
    root, expected, _, index = campaign
    markdown = index.with_name("report.md").read_text()
    progress = table_rows(markdown, "Progress (state/)")
    for name, labels in expected.items():
        cases = sum(labels.values())
        assert progress[name][1:] == ["1", "1", str(cases), str(cases + 7), "2", "-", "-"], progress
    assert "- **skipped**: fa4: needs CUDA" in markdown


def test_per_backend_state_files_add_up(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "sdpa-math.json").write_text(json.dumps({"rounds": 3, "examples": 600, "seconds": 9.0}))
    (tmp_path / "state" / "lane0.json").write_text(json.dumps({"backends": {"sdpa-math": {"rounds": 2,
                                                                                          "examples": 50}}}))
    (tmp_path / "state" / "lane1.json").write_text("{\"backends\": ")
    c = read_campaign(tmp_path)
    assert c.state == {"sdpa-math": {"rounds": 5, "cases": None, "examples": 650, "seconds": 9.0, "lanes": 2}}
    assert len(c.unreadable) == 1 and "lane1.json" in c.unreadable[0]


def test_truncated_last_line_is_skipped_and_counted(campaign):
    root = campaign[0]
    c = read_campaign(root)
    assert len(c.unreadable) == 1 and "lane1.jsonl:" in c.unreadable[0]
    assert "1 line(s) or file(s) skipped" in (campaign[3].parent / "report.md").read_text()


def test_html_parses_escapes_data_and_links_valid_pngs(campaign):
    root, _, _, index = campaign
    page = parse(index)
    assert page.tags["table"] >= 5 and page.tags["script"] == 0
    assert NASTY in "".join(page.text)                 # shown as text, so it was escaped
    assert LINK in page.links                          # the href attribute decodes back to the link
    assert sorted(page.images) == ["combinations.png", "coverage.png", "outcomes.png", "rate.png", "ratios.png"]
    for name in page.images:
        assert_valid_png(index.parent / name)
    repro = [link for link in page.links if link.endswith(".py")]
    assert repro and all((index.parent / link).exists() for link in repro)


def test_markdown_escapes_pipes_and_lists_findings(campaign):
    markdown = (campaign[3].parent / "report.md").read_text()
    assert "<script>" not in markdown
    assert '\\<script\\>alert("x")\\</script\\> & \\| pipes' in markdown
    findings = table_rows(markdown, "Findings (corpus)")
    row = findings["broken-zero-causal"]
    assert row[1] == "FAIL:ALL_ZERO" and "sq=1 skv=1" in row[4] and "causal" in row[4]
    assert "(https://example.org/bug?id=1&kind=%3Czero%3E)" in row[5]
    assert row[6].startswith("[broken-zero-causal-FAIL-ALL_ZERO-")


def test_findings_saved_unconfirmed_are_marked_with_how_to_settle_them(tmp_path):
    fail = Verdict("FAIL", "ALL_ZERO", "every graded output element is 0")
    corpus = tmp_path / "corpus"
    corpus_io.save(corpus, corpus_io.Entry(backend="b", case=Case(causal=True), verdict=fail,
                                           unconfirmed=corpus_io.OUT_OF_TIME_UNCONFIRMED), repro=False)
    corpus_io.save(corpus, corpus_io.Entry(backend="b", case=Case(causal=True, sq=3), verdict=fail), repro=False)
    corpus_io.save(corpus, corpus_io.Entry(backend="c", case=Case(causal=True), verdict=fail), repro=False)
    log = tmp_path / "run.jsonl"
    log.write_text(caselog.record("b", Case(causal=True), fail, 0.01, verdict=fail.to_dict()))
    markdown = build_report(log, corpus=corpus).with_name("report.md").read_text()
    rows = table_rows(markdown, "Findings (corpus)")
    assert rows["b"][2] == "2 (1 unconfirmed)" and rows["c"][2] == "1", rows
    section = markdown.split("## Findings (corpus)\n", 1)[1].split("\n## ", 1)[0]
    assert "unconfirmed: 1 saved without a rerun" in section and "attnfuzz replay" in section, section


def test_known_bugs_this_campaign_found_itself_are_counted_apart(tmp_path):
    """A campaign counts a failure KNOWN when a corpus known bug matches it, or when it saved that bug earlier
    itself (fuzz/campaign/lane.py, seen_in): the report says how many of the KNOWN were the latter."""
    from attnfuzz.store.known import mark_known
    from attnfuzz.campaign.lane import seen_in
    case, fail = Case(causal=True), Verdict("FAIL", "ALL_ZERO", "every graded output element is 0")
    corpus_io.save(tmp_path / "corpus", corpus_io.Entry(backend="b", case=case, verdict=fail), repro=False)
    here = mark_known(seen_in(tmp_path / "corpus"), "b", case, fail)
    listed = mark_known(lambda *_: {"link": LINK}, "b", case, fail)
    assert here.status == listed.status == "KNOWN" and here.checks != listed.checks
    log = tmp_path / "run.jsonl"
    log.write_text("".join(caselog.record("b", case, v, 0.01, verdict=v.to_dict()) for v in (here, listed, listed)))
    rows = table_rows(build_report(log).with_name("report.md").read_text(), "Totals per backend")
    assert rows["b"][5] == "3 (1)", rows["b"]


def test_a_single_log_file_without_lane_or_time(tmp_path):
    log = tmp_path / "run.jsonl"
    labels, _ = fuzz_to_log(get("sdpa-math", "cpu"), log, lane=None, examples=15)
    index = build_report(log)
    assert index == tmp_path / "report" / "index.html"
    rows = table_rows(index.with_name("report.md").read_text(), "Totals per backend")
    assert rows["sdpa-math"][2] == str(sum(labels.values()))
    assert_valid_png(index.with_name("ratios.png"))


def test_a_backend_with_no_graded_case_still_gets_plots(tmp_path):
    log = tmp_path / "refused.jsonl"
    log.write_text("".join(_line("picky", Case(), Verdict("UNSUPPORTED", None, "no float32"), None)
                           for _ in range(3)))
    index = build_report(log, tmp_path / "out")
    markdown = index.with_name("report.md").read_text()
    assert table_rows(markdown, "Totals per backend")["picky"][2:8] == ["3", "0", "0", "0", "0", "3"]
    assert table_rows(markdown, "UNSUPPORTED by reason (top 5 per backend)")["picky"][1:] == ["no float32", "3"]
    for name in ("ratios.png", "outcomes.png", "coverage.png"):
        assert_valid_png(index.with_name(name), min_bytes=3000)


def test_plots_say_so_when_there_is_nothing(tmp_path):
    assert_valid_png(plot_ratios({}, tmp_path / "r.png"), min_bytes=3000)
    assert_valid_png(plot_ratios({"a": [], "b": [0.0, 0.5, float("inf")]}, tmp_path / "r2.png"))
    assert_valid_png(plot_coverage(Coverage(), tmp_path / "c.png"), min_bytes=2000)


def test_cli_report_command(campaign, tmp_path):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "elsewhere"
    assert cmd_report(parser.parse_args(["report", str(campaign[0]), "--out", str(out)])) == 0
    assert (out / "index.html").exists() and (out / "report.md").exists()
    assert cmd_report(parser.parse_args(["report", str(tmp_path / "missing")])) == 2
    from attnfuzz.cli import main
    assert main(["report", str(campaign[0]), "--out", str(tmp_path / "via-cli")]) == 0
    assert (tmp_path / "via-cli" / "index.html").exists()


def test_the_drawn_distribution_is_reported_per_backend(campaign):
    _, expected, _, index = campaign
    markdown = index.with_name("report.md").read_text()
    for title in ("Drawn cases by sq", "Drawn cases by head dim", "Drawn cases by shape"):
        rows = table_rows(markdown, title)
        for column, name in enumerate(sorted(expected), start=1):
            counts = [int(row[column].split("(")[1].rstrip(")")) for row in rows.values() if row[column] != "-"]
            assert sum(counts) == sum(expected[name].values()), (title, name, rows)
    assert "## Drawn cases that repeat an earlier one" in markdown


def test_a_log_files_report_lands_where_the_help_says(tmp_path, capsys):
    from attnfuzz.cli import main
    log = tmp_path / "run.jsonl"
    log.write_text(_line("picky", Case(), Verdict("UNSUPPORTED", None, "no float32"), None))
    assert main(["report", "--help"]) == 0
    assert "report/ beside a single log file" in " ".join(capsys.readouterr().out.split())
    assert main(["report", str(log)]) == 0
    assert f"report written: {tmp_path / 'report' / 'index.html'}" in capsys.readouterr().out
