"""Triage: which known bug of the corpus takes each failure a log recorded, and which failures none takes.

    attnfuzz triage runs/campaign1 runs/ci.jsonl --corpus corpus

A known bug's `when` and `match` decide what the fuzzer counts as KNOWN and goes past. Too broad, an entry swallows
other bugs: on 2026-11-30 an FA4 "dq rows >= 64" entry with an empty `when` had absorbed 58 failures of two other
backward bugs, none with a row past 64. Run this after editing the corpus (or on an old campaign's logs) to see what
each entry takes now and what would come out as new findings.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from attnfuzz.store import caselog
from attnfuzz.store import corpus as corpus_io
from attnfuzz.report.table import Table
from attnfuzz.oracles.verdict import FAILED, KNOWN, Verdict
from attnfuzz.strategies.case import Case


def add_parser(sub) -> None:
    p = sub.add_parser("triage", help="which corpus known bug takes each failure in case logs; exit 1 when some "
                       "failure is taken by none")
    p.add_argument("logs", nargs="+", type=Path, help="case logs (.jsonl) or folders holding them (a campaign)")
    p.add_argument("--corpus", type=Path, help="known bugs to match beside the corpus shipped with attnfuzz (default: "
                   "the findings folder, see `attnfuzz run --help`)")
    p.add_argument("--json", action="store_true")


def log_files(paths: list[Path]) -> list[Path]:
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise ValueError(f"triage: {', '.join(missing)} does not exist; give case logs (.jsonl) or campaign folders")
    return [f for path in paths for f in caselog.log_files(path)]


def _candidates(row: dict) -> list[Verdict]:
    """The failure a row recorded. A KNOWN verdict no longer says whether it was a FAIL or a CRASH, so each failed
    status is tried with its diagnosis (the diagnoses of the two do not overlap)."""
    status, _, diagnosis = row["label"].partition(":")
    message = (row.get("verdict") or {}).get("message") or row.get("message", "")
    statuses = FAILED if status == KNOWN else (status,)
    return [Verdict(s, diagnosis or None, message) for s in statuses]


def triage(paths: list[Path], corpus: Path | None = None) -> dict:
    """{"taken": {entry: {"cases": n, "shapes": [...]}}, "untaken": {backend label: {"cases": n, "example": ...}}}
    over the known bugs of the shipped corpus and `corpus` (default: the findings folder)."""
    known = corpus_io.known_bugs(corpus_io.shipped_dir(), corpus_io.findings_dir(corpus))
    taken: dict[str, dict] = defaultdict(lambda: {"cases": 0, "shapes": []})
    untaken: dict[str, dict] = defaultdict(lambda: {"cases": 0, "example": None})
    for row in (r for f in log_files(paths) for r in caselog.rows(f)):
        if row.get("label", "").split(":")[0] not in FAILED + (KNOWN,):
            continue
        case = Case.from_dict(row["case"])
        bug = next((b for v in _candidates(row) if (b := known(row["backend"], case, v)) is not None), None)
        if bug is None:
            slot = untaken[f"{row['backend']} {row['label']}"]
            slot["cases"] += 1
            slot["example"] = slot["example"] or {"case": row["case"], "message": row.get("message", "")[:200]}
            continue
        slot = taken[bug["entry"]]
        slot["cases"] += 1
        shape = _shape(case)
        if shape not in slot["shapes"]:
            slot["shapes"].append(shape)
    return {"taken": dict(taken), "untaken": dict(untaken)}


def _shape(case: Case) -> str:
    lens = "" if case.seqlens_q is None else f" lens q {list(case.seqlens_q)} kv {list(case.seqlens_kv)}"
    return (f"b={case.b} sq={case.sq} skv={case.skv} d=({case.d_qk},{case.d_v}) {case.layout} {case.softmax} "
            f"{case.dtype}{lens}")


def _taken_rows(result: dict) -> list[list[str]]:
    """[entry, cases it took, distinct shapes, two of them], the entry taking most first."""
    return [[name, str(slot["cases"]), str(len(slot["shapes"])), "; ".join(slot["shapes"][:2])]
            for name, slot in sorted(result["taken"].items(), key=lambda kv: -kv[1]["cases"])]


def markdown(result: dict) -> str:
    lines = ["| known bug (corpus entry) | cases it takes | distinct shapes | e.g. |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in _taken_rows(result)]
    lines += ["", "| taken by no known bug (new findings) | cases | e.g. |", "|---|---|---|"]
    for label, slot in sorted(result["untaken"].items(), key=lambda kv: -kv[1]["cases"]):
        lines.append(f"| {label} | {slot['cases']} | {_shape(Case.from_dict(slot['example']['case']))} |")
    return "\n".join(lines)


def known_table(campaign_dir: Path, known: Path):
    """For a campaign's report: which known bug of `known` (the campaign's --known corpus) took how many of its
    failures, and of what shapes; None when that corpus is not here."""
    if not known.is_dir():
        return None
    rows = _taken_rows(triage([campaign_dir], known))
    return Table(f"Known bugs by corpus entry ({known})", ["entry", "cases it took", "distinct shapes", "e.g."], rows,
                 "an entry taking many shapes unlike its own case may be swallowing another bug (`attnfuzz triage`); "
                 "failures no known bug takes are the campaign's own findings"
                 if rows else "no failure matched a known bug")


def cmd_triage(args) -> int:
    try:
        result = triage(args.logs, args.corpus)
    except (ValueError, corpus_io.CorpusError) as e:
        print(f"attnfuzz triage: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else markdown(result))
    return 1 if result["untaken"] else 0
