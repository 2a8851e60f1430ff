"""bench/recall.py's results: per entry the seeds that found it and the median cases and seconds to the match; an
entry is recalled when found in at least half its seeds."""

from __future__ import annotations

import json
import math
from pathlib import Path


def median_low(values: list[float]) -> float:
    return sorted(values)[(len(values) - 1) // 2] if values else math.inf


def summarize(runs: dict[str, list[dict]], seeds: int) -> dict:
    """Per entry: found k of N, median cases and seconds over the seeds that found it, recalled or not; overall:
    the recalled entries and the median of their median seconds and cases (the cases leave out what a process
    spends before its first case: on a GPU about 10 s of imports and CUDA's start, a floor under every match), and
    the entries found by any seed (`found_by_any`: seeds run at once are the lanes of one machine, as a campaign's
    are, and the machine found what one lane found)."""
    table = {}
    for name, rows in runs.items():
        hits = [r for r in rows if r.get("found")]
        table[name] = {"found": len(hits), "seeds": seeds, "recalled": median_low(
            [r["seconds"] if r.get("found") else math.inf for r in rows]) < math.inf,
            "median_cases": median_low([r["cases"] for r in hits]) if hits else None,
            "median_seconds": median_low([r["seconds"] for r in hits]) if hits else None, "runs": rows}
    recalled = [t for t in table.values() if t["recalled"]]
    return {"entries": table, "recalled": len(recalled), "run": len(table),
            "found_by_any": sum(1 for t in table.values() if t["found"]),
            "median_seconds": median_low([t["median_seconds"] for t in recalled]) if recalled else None,
            "median_cases": median_low([t["median_cases"] for t in recalled]) if recalled else None}


def searched_note(row: dict) -> str:
    """What a seed that did not find its entry graded: the verdicts of its cases, and the failures that no held-out
    record took (a new bug, or a record narrower than its bug)."""
    counts = ", ".join(f"{status} {n}" for status, n in sorted(row.get("statuses", {}).items()))
    other = ", ".join(f"{label} x{n}" for label, n in sorted(row.get("unmatched", {}).items()))
    unrun = f", {row['unrun']} of them answered unrun" if row.get("unrun") else ""
    return (f"seed {row['seed']}: {row['cases_run']} cases" + (f" ({counts}{unrun})" if counts else "")
            + (f", taken by no held-out record: {other}" if other else ""))


def examples_met(summary: dict) -> list[str]:
    """One line per seed and label of the failures no held-out record took: the smallest case met (a seed searching
    for several entries reports them under each, shown once here)."""
    from attnfuzz.strategies.case import Case
    lines, shown = [], set()
    for name, t in summary["entries"].items():
        for r in t["runs"]:
            for label, ex in sorted(r.get("unmatched_examples", {}).items()):
                key = (r["seed"], label, json.dumps(ex, sort_keys=True))
                if key in shown:
                    continue
                shown.add(key)
                try:
                    case = repr(Case.from_dict(ex["case"]))
                except ValueError:
                    case = json.dumps(ex["case"], sort_keys=True)
                lines.append(f"  seed {r['seed']} ({name}), smallest {label} taken by no held-out record, at case "
                             f"{ex['cases']}: {case}: {ex['message'][:300]}")
    return lines


def show(build: str, summary: dict, width: int) -> str:
    lines = [f"[{build}]", f"{'entry':<{width}}  found  med. cases  med. s  matched"]
    for name, t in summary["entries"].items():
        cases = "-" if t["median_cases"] is None else str(t["median_cases"])
        secs = "-" if t["median_seconds"] is None else f"{t['median_seconds']:.1f}"
        matched = sorted({r["matched"] for r in t["runs"] if r.get("matched")} - {Path(name).stem})
        errors = sorted({r["error"] for r in t["runs"] if r.get("error")})
        searched = [searched_note(r) for r in t["runs"] if not r.get("found") and "cases_run" in r]
        note = "; ".join((["via " + ", ".join(matched)] if matched else []) + errors + searched)
        lines.append(f"{name:<{width}}  {t['found']}/{t['seeds']:<3}  {cases:>10}  {secs:>6}  {note}")
    lines += examples_met(summary)
    med = "-" if summary["median_seconds"] is None else f"{summary['median_seconds']:.1f} s"
    cases = "-" if summary.get("median_cases") is None else str(summary["median_cases"])
    lines.append(f"found by any seed: {summary.get('found_by_any', '-')} of {summary['run']} entries")
    lines.append(f"recalled (found in at least half the seeds): {summary['recalled']} of {summary['run']} entries; "
                 f"median seconds to the match over those: {med}; median cases: {cases}")
    return "\n".join(lines)


def show_all(summaries: dict, chosen: dict, device: str) -> str:
    """Each build's table, then what was searched how (an ISA, a held-out group) and the entries not run, with why."""
    width = max([len(e) for e in chosen["run"]] + [5])
    lines = [show(name, summary, width) for name, summary in summaries.items()]
    for entry, what in chosen["run"].items():
        if what.get("isa"):
            lines.append(f"{entry}: searched under ATEN_CPU_CAPABILITY={what['isa']}, the ISA it was recorded on")
        if len(what["held_out"]) > 1:
            lines.append(f"{entry}: held out with {', '.join(n for n in what['held_out'] if n != entry)}")
    lines += [f"{entry}: not run: {why}" for entry, why in chosen["not_run"].items()]
    if not chosen["run"]:
        lines.append(f"no entry can run on {device}")
    return "\n".join(lines)
