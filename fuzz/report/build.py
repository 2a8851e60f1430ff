"""The campaign report: `attnfuzz report DIR` reads a campaign directory (or one `attnfuzz run --log` file) and
writes report.md and index.html, with PNG plots beside them, into DIR/report (report/ beside a log file; or --out).

Read as a stream, so a campaign of millions of cases fits in memory: per backend the labels, the refusal reasons,
the graded error ratios and the coverage cells. A line that does not parse (the last one of a killed process) is
skipped and counted. Every string from the data is escaped in the HTML (and its pipes in the markdown).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from attnfuzz.store import caselog
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import paths
from attnfuzz.report.triage import known_table
from attnfuzz.report.stalls import Stalls
from attnfuzz.report.table import Table, md_text, table_html, table_markdown
from attnfuzz.report.coverage import AXES, SHAPE_CLASSES, SPACE_SIZE, Coverage
from attnfuzz.report.combos import Combos, campaign_reports, combos_table
from attnfuzz.engine.skip_known import answered_unrun
from attnfuzz.report.rate import UNRUN, Timeline, rate_table
from attnfuzz.report.state import add_state, state_table
from attnfuzz.strategies.case import Case

GRADED = ("PASS", "FAIL", "KNOWN")      # statuses whose ratio is an error over the bound
CRASHED = ("CRASH", "HANG", "FLAKY")
TOP_REFUSALS = 5


@dataclass
class BackendTotals:
    """What one backend's case lines add up to."""

    labels: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)
    ratios: list[float] = field(default_factory=list)
    seconds: float = 0.0
    worst_pass: float = 0.0
    known_here: int = 0      # KNOWN because this campaign had saved the bug already, not a corpus known bug

    @property
    def examples(self) -> int:
        return sum(self.labels.values())

    def count(self, *statuses: str) -> int:
        return sum(n for label, n in self.labels.items() if label.split(":", 1)[0] in statuses)

    def outcomes(self) -> dict[str, int]:
        return {"passed": self.count("PASS"), "failed": self.count("FAIL"), "known": self.count("KNOWN"),
                "crashed": self.count(*CRASHED), "refused": self.count("UNSUPPORTED")}


@dataclass
class Campaign:
    """A campaign as read from disk: its settings, per-backend totals and coverage, saved findings, and what could
    not be read."""

    source: Path
    meta: dict = field(default_factory=dict)
    state: dict[str, dict] = field(default_factory=dict)
    totals: dict[str, BackendTotals] = field(default_factory=dict)
    coverage: Coverage = field(default_factory=Coverage)
    combos: dict[str, Combos] = field(default_factory=dict)   # per backend, its graded cases' features
    findings: list[tuple[Path, corpus_io.Entry]] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    span: tuple[float, float] | None = None     # first and last case time (unix), where the lines carry one
    timelines: dict[str, Timeline] = field(default_factory=dict)   # per backend, its timed cases (report/rate.py)
    stalls: Stalls = field(default_factory=Stalls)   # every lane's timed cases, for whole-GPU stalls (report/stalls.py)

    def add_line(self, row: dict) -> None:
        backend, label = row["backend"], row["label"]
        case = Case.from_dict(row["case"])     # first: a malformed case raises before anything counts
        self.coverage.add(backend, case, label,
                          batch_invariant=(row.get("verdict") or {}).get("batch_invariant"))
        totals = self.totals.setdefault(backend, BackendTotals())
        totals.labels[label] += 1
        unrun = answered_unrun(str(row.get("message", "")))   # a known crash's case answered without running
        if not label.startswith("UNSUPPORTED") and not unrun:
            self.combos.setdefault(backend, Combos()).add(case)
        if isinstance(row.get("device"), str):   # a run's log names its device (a campaign's campaign.json does)
            self.meta.setdefault("device", row["device"])
        totals.seconds += float(row.get("seconds") or 0.0)
        status = label.split(":", 1)[0]
        if status == "KNOWN" and caselog.seen_here(row):
            totals.known_here += 1
        if status == "UNSUPPORTED":
            totals.refusals[str(row.get("message", ""))] += 1
        elif status in GRADED:
            ratio = _ratio(row.get("ratio"))
            if ratio is not None:
                totals.ratios.append(ratio)
                if status == "PASS":
                    totals.worst_pass = max(totals.worst_pass, ratio)
        if isinstance(row.get("time"), (int, float)):
            t = float(row["time"])
            self.span = (min(self.span[0], t), max(self.span[1], t)) if self.span else (t, t)
            self.timelines.setdefault(backend, Timeline()).add(t, UNRUN if unrun else status,
                                                               float(row.get("seconds") or 0.0))
            self.stalls.add(row)


def _ratio(value) -> float | None:
    try:
        ratio = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(ratio) else ratio


def _read_lines(campaign: Campaign, path: Path) -> None:
    with path.open(errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not (isinstance(row, dict) and isinstance(row.get("backend"), str)
                        and isinstance(row.get("label"), str)):
                    raise ValueError("not an object with a backend and a label")
                campaign.add_line(row)
            except (ValueError, KeyError, TypeError) as e:
                campaign.unreadable.append(f"{path}:{number}: {type(e).__name__}: {str(e)[:160]}")


def read_campaign(source: Path, corpus: Path | None = None) -> Campaign:
    """A campaign directory (campaign.json, cases/*.jsonl, state/*.json, corpus/), a folder of *.jsonl logs, or one
    log file. `corpus` overrides where findings are read from (default: the campaign's corpus/)."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist; give a campaign directory or an attnfuzz --log file")
    campaign = Campaign(source)
    logs = caselog.log_files(source)
    if not source.is_file():
        meta = source / "campaign.json"
        if meta.exists():
            try:
                campaign.meta = json.loads(meta.read_text())
            except ValueError as e:  # not JSON, not UTF-8
                campaign.unreadable.append(f"{meta}: {type(e).__name__}: {e}")
        for path in sorted((source / "state").glob("*.json")):
            try:
                add_state(campaign.state, path.stem, json.loads(path.read_text()))
            except (TypeError, ValueError, AttributeError, KeyError) as e:
                campaign.unreadable.append(f"{path}: {type(e).__name__}: {e}")
        corpus = corpus or source / "corpus"
    for path in logs:
        _read_lines(campaign, path)
    if corpus is not None and Path(corpus).is_dir():
        campaign.findings, errors = corpus_io.load_all(Path(corpus))
        campaign.unreadable += [str(e) for e in errors]
    return campaign


def totals_table(c: Campaign) -> Table:
    versions = c.meta.get("versions") or {}
    rows = []
    for name in sorted(c.totals):
        t = c.totals[name]
        cells = c.coverage.tally(name)
        rate = f"{t.examples / t.seconds:.1f}" if t.seconds > 0 else "-"
        known = f"{t.count('KNOWN')}" + (f" ({t.known_here})" if t.known_here else "")
        rows.append([name, str(versions.get(name, "")), str(t.examples), str(t.count("PASS")), str(t.count("FAIL")),
                     known, str(t.count(*CRASHED)), str(t.count("UNSUPPORTED")),
                     f"{cells['covered']}", f"{cells['failing']}", rate,
                     f"{t.worst_pass:.3g}" if t.count("PASS") else "-", _batch_cell(c.coverage.batch.get(name))])
    return Table("Totals per backend", ["backend", "version", "cases", "PASS", "FAIL", "KNOWN (found here)",
                                        "CRASH/HANG/FLAKY", "UNSUPPORTED", "cells covered", "cells failing",
                                        "cases/s", "worst PASS ratio", "batch invariant"], rows,
                 "cases: the cases run, one per logged line (a case Hypothesis draws again is answered from the log, "
                 "not run again: Progress's examples count it); "
                 f"KNOWN (found here): failures of known bugs; in brackets, those known only because this campaign "
                 f"had saved them already; cells of {SPACE_SIZE} (fuzz/report/coverage.py); cases/s over the seconds the "
                 "backend's lanes spent; worst PASS ratio: how close the passing cases came to the bound (1); batch invariant: of the "
                 "cases batch-checked (fuzz/engine/batch.py), those whose sequence had the same bits alone and in its "
                 "batch (a backend that claims it fails as BATCH_VARIANT where it does not)")


def _batch_cell(seen) -> str:
    return f"{seen['invariant']}/{seen['checked']}" if seen else "-"


def labels_table(c: Campaign) -> Table:
    rows = [[name, label, str(n)] for name in sorted(c.totals)
            for label, n in sorted(c.totals[name].labels.items())
            if label.split(":", 1)[0] not in ("PASS", "UNSUPPORTED")]
    return Table("Failures by label", ["backend", "label", "cases"], rows,
                 "" if rows else "no case failed (FAIL, CRASH, HANG, FLAKY) or matched a known bug")


def refusals_table(c: Campaign) -> Table:
    rows = [[name, reason, str(n)] for name in sorted(c.totals)
            for reason, n in c.totals[name].refusals.most_common(TOP_REFUSALS)]
    return Table(f"UNSUPPORTED by reason (top {TOP_REFUSALS} per backend)", ["backend", "reason", "cases"], rows,
                 "" if rows else "no backend refused a case")


def _shape(case) -> str:
    parts = [f"b={case.b} sq={case.sq} skv={case.skv} h={case.h}/{case.hk} d={case.d_qk}/{case.d_v}", case.dtype,
             case.mask_kind]
    if case.window != (None, None):
        parts.append(f"window={case.window}")
    if case.alignment != "top_left":
        parts.append(case.alignment)
    if case.layout != "bshd" or case.memory != "contiguous":
        parts.append(f"{case.layout}/{case.memory}")
    if case.storage != ("plain", "plain", "plain"):
        parts.append("storage q/k/v=" + "/".join(case.storage))
    return " ".join(parts)


def _short_link(link: str) -> str:
    """owner/repo#N for a GitHub issue or pull request, host/.../last-part for other URLs."""
    parts = link.split("://", 1)[-1].rstrip("/").split("/")
    if parts[0] == "github.com" and len(parts) >= 5 and parts[3] in ("issues", "pull"):
        return f"{parts[1]}/{parts[2]}#{parts[4]}"
    return "/".join(parts) if len(parts) <= 3 else f"{parts[0]}/{parts[1]}/.../{parts[-1]}"


def findings_table(c: Campaign, out_dir: Path) -> Table:
    groups: dict[tuple[str, str], list[tuple[Path, corpus_io.Entry]]] = {}
    for path, entry in c.findings:
        groups.setdefault((entry.backend, entry.verdict.label), []).append((path, entry))
    rows, unconfirmed = [], 0
    for (backend, label), items in sorted(groups.items()):
        path, entry = min(items, key=lambda pe: (pe[1].case.size, pe[0].name))
        links = sorted({e.known_bug["link"] for _, e in items if e.known_bug})
        repro = path.with_suffix(".py")
        unsure = sum(1 for _, e in items if e.unconfirmed)
        unconfirmed += unsure
        rows.append([backend, label, f"{len(items)}" + (f" ({unsure} unconfirmed)" if unsure else ""),
                     str(sum(e.seen for _, e in items)), _shape(entry.case),
                     [(_short_link(link), link) for link in links] or "new",
                     (repro.name, os.path.relpath(repro, out_dir)) if repro.exists() else "-"])
    note = "" if rows else "no corpus entries"
    if unconfirmed:
        note = (f"unconfirmed: {unconfirmed} saved without a rerun that reproduced it (the campaign stopped, or ran "
                f"out of time first); `attnfuzz replay` of the campaign's corpus confirms or drops each")
    return Table("Findings (corpus)", ["backend", "label", "entries", "seen", "smallest case", "known bug", "repro"],
                 rows, note)


def marginal_tables(c: Campaign) -> list[Table]:
    names = c.coverage.backends()
    margins = {name: c.coverage.marginals(name) for name in names}
    tables = []
    for axis in AXES:
        per = {name: margins[name][axis.name] for name in names}
        rows = []
        for i, value in enumerate(axis.values):
            row = [value]
            for name in names:
                m = per[name][i]
                k = m.counts
                row.append(f"{m.cells_covered} cells; {k.passed} P {k.failed} F {k.known} K {k.refused} R"
                           if k.cases else "-")
            rows.append(row)
        total = SPACE_SIZE // len(axis.values)
        tables.append(Table(f"Coverage by {axis.name}", [axis.name, *names], rows,
                            f"covered cells of {total} per value; cases P pass, F fail/crash/hang/flaky, K known, "
                            "R refused"))
    return tables + distribution_tables(c)


def distribution_tables(c: Campaign) -> list[Table]:
    """The realized distribution: per shape class, the share of each backend's drawn cases (refused ones too)."""
    names = c.coverage.backends()
    drawn = {name: c.coverage.distribution(name) for name in names}
    tables = []
    for label, (values, _) in SHAPE_CLASSES.items():
        rows = [[value] + [f"{100 * drawn[n].counts[label][value] / drawn[n].cases:.1f}% "
                           f"({drawn[n].counts[label][value]})" if drawn[n].cases else "-" for n in names]
                for value in values if any(drawn[n].counts[label][value] for n in names)]
        tables.append(Table(f"Drawn cases by {label}", [label, *names], rows,
                            "share of the backend's cases (count); see SHAPE_CLASSES in fuzz/report/coverage.py"))
    rows = [[f"{100 * drawn[n].repeats / max(drawn[n].cases, 1):.1f}% ({drawn[n].repeats})" for n in names]]
    tables.append(Table("Drawn cases that repeat an earlier one", names, rows,
                        "the same case (every field, seed included) drawn again for the same backend"))
    return tables


def _header(c: Campaign) -> list[tuple[str, str]]:
    items = [("source", str(c.source))]
    for key in ("backends", "skipped", "device", "lanes", "hours", "seed", "db", "round_examples", "climb_every",
                "max_len", "isolate", "known", "started"):
        value = c.meta.get(key)
        if value is not None and value != {}:
            items.append((key, ", ".join(map(str, value)) if isinstance(value, list) else
                          "; ".join(f"{k}: {v}" for k, v in value.items()) if isinstance(value, dict) else str(value)))
    if c.span:
        items.append(("cases logged over", f"{(c.span[1] - c.span[0]) / 3600:.2f} h"))
    everyone = c.coverage.summary()
    items.append(("coverage (all backends)", everyone))
    if c.unreadable:
        items.append(("unreadable", f"{len(c.unreadable)} line(s) or file(s) skipped; first: {c.unreadable[0]}"))
    return items


PLOTS = (("ratios.png", "Error / bound per backend"), ("outcomes.png", "Outcomes per backend"),
         ("coverage.png", "Coverage by axis value"), ("combinations.png", "Feature combinations against cases"),
         ("rate.png", "Graded cases per minute"))
STYLE = ("body{font-family:sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;margin:.5em 0}"
         "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left;vertical-align:top}"
         "th{background:#eee}.note{color:#555;font-size:13px}img{max-width:100%}")


def build_report(campaign_dir: Path, out_dir: Path | None = None, corpus: Path | None = None) -> Path:
    """Read the campaign and write report.md, index.html and the plots into `out_dir` (default DIR/report, or
    report/ beside a single log file). Returns the path of index.html."""
    from attnfuzz.report import plots as plots
    campaign_dir = Path(campaign_dir)
    c = read_campaign(campaign_dir, corpus)
    out_dir = Path(out_dir) if out_dir else (campaign_dir.parent if campaign_dir.is_file() else campaign_dir) / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    plots.plot_ratios({name: t.ratios for name, t in c.totals.items()}, out_dir / PLOTS[0][0])
    plots.plot_outcomes({name: t.outcomes() for name, t in c.totals.items()}, out_dir / PLOTS[1][0])
    plots.plot_coverage(c.coverage, out_dir / PLOTS[2][0])
    reports = campaign_reports(c.combos, str(c.meta.get("device") or "cpu"), c.meta.get("max_len"))
    combos = combos_table(reports)
    plots.plot_combinations(reports, out_dir / PLOTS[3][0])
    plots.plot_rate(c.timelines, c.span[0] if c.span else None, out_dir / PLOTS[4][0])
    stalls = c.stalls.table()
    tables = [totals_table(c), rate_table(c.timelines, c.span)] + ([stalls] if stalls else []) + \
        [labels_table(c), refusals_table(c), combos, findings_table(c, out_dir)]
    if c.state:
        tables.append(state_table(c.state))
    if c.meta.get("known") and campaign_dir.is_dir():
        known = known_table(campaign_dir, Path(c.meta["known"]))
        if known is not None:
            tables.append(known)
    margins = marginal_tables(c)
    header = _header(c)
    md = ["# attnfuzz campaign report", ""] + [f"- **{md_text(k)}**: {md_text(v)}" for k, v in header] + [""]
    md += [table_markdown(t) for t in tables]
    md += [f"## {title}\n\n![{title}]({name})\n" for name, title in PLOTS]
    md += [table_markdown(t) for t in margins]
    (out_dir / "report.md").write_text("\n".join(md))
    page = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8"><title>attnfuzz campaign report</title>',
            f"<style>{STYLE}</style></head><body>", "<h1>attnfuzz campaign report</h1>", "<ul>"]
    page += [f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in header] + ["</ul>"]
    page += [table_html(t) for t in tables]
    page += [f'<h2>{html.escape(title)}</h2><img src="{name}" alt="{html.escape(title)}">' for name, title in PLOTS]
    page += [table_html(t) for t in margins] + ["</body></html>"]
    index = out_dir / "index.html"
    index.write_text("\n".join(page))
    return index


# -- CLI ------------------------------------------------------------------------------------------------------------
def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="write report.md and index.html (with plots) for a campaign")
    p.add_argument("source", type=Path, help="a campaign directory, or one `attnfuzz run --log` JSONL file")
    p.add_argument("--out", type=Path, help="where to write the report (default: SOURCE/report for a campaign "
                   "directory or a folder of logs, report/ beside a single log file)")
    p.add_argument("--corpus", type=Path, help="read findings from here (default SOURCE/corpus)")
    return p


def cmd_report(args) -> int:
    if not args.source.exists():
        print(f"attnfuzz report: {args.source} does not exist; give a campaign directory or a --log file",
              file=sys.stderr)
        return 2
    if args.out:
        paths.writable_folder(args.out, "--out")
    index = build_report(args.source, args.out, args.corpus)
    print(f"report written: {index} (and report.md beside it)")
    return 0
