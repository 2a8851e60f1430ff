"""Targeted GPU checks that separate adapter mistakes from backend bugs in the first H200 findings (FA4, TE).

    python3 bench/verify_findings.py --findings .gpu-findings/single/corpus --out DIR [--only F5,F6] [--budget-s 210]

For each finding the first run's shrunk case (built in, and checked against its corpus file in --findings: a
missing or different file is reported on the line) runs as-is and with the variations that tell the two apart: the
same values made contiguous, FA4 called directly next to TE's call of it, the other diagonal alignment where it
changes nothing in the math, TE's own mask helpers probed directly, both padding-mask conventions, the adapter's
capability rules bypassed so the library's own refusal shows. Every run is graded against the float64 oracle
(attnfuzz.oracles.grade). One line per variation: finding, group, variation, verdict label, ratio, whether it came out as
predicted, what ran. Variations run in one child process per group (te-unfused, te-fused, te-flash, fa4), so a CUDA
fault in one group cannot stop the others; every exception is recorded, never raised; a group past its share of the
budget (the whole, less what the groups after it reserve) skips what is left. Writes DIR/verify.jsonl and
DIR/summary.txt. The cases and variations live in bench/verify_variations.py; this file runs them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.verify_variations import FIRST_RUN, HEADLINES, Variation, variations  # noqa: E402
from attnfuzz.strategies.case import Case  # noqa: E402

GROUPS = ("te-unfused", "te-fused", "te-flash", "fa4")       # run order; fa4 compiles most, it goes last
RESERVE_S = {"te-unfused": 25, "te-fused": 20, "te-flash": 45, "fa4": 90}   # kept for each group still to run
GRACE_S = 30          # past a group's share before a silent child is killed...
HARD_MARGIN_S = 15    # ...but never later than this past the whole budget (the run stays under 4 minutes)


# -- running -----------------------------------------------------------------------------------------------------
def base_case(finding: str, findings: Path) -> tuple[Case, str]:
    """The first run's case of `finding` and a note on the corpus file in --findings: the variations were designed
    around these cases, so a corpus case that differs is reported, not silently used."""
    prefix, case = FIRST_RUN[finding]
    if not prefix:
        return case, "case: built in"
    files = sorted(findings.glob(f"{prefix}-*.json"))
    if not files:
        return case, f"no {prefix}-*.json in --findings, ran the first run's case"
    found = Case.from_dict(json.loads(files[0].read_text()).get("case"), where=str(files[0]))
    return case, (f"case: {files[0].name}" if found == case else
                  f"{files[0].name} holds {found!r}, not the first run's case: ran the first run's")


def outcome(label: str, expect: str | None) -> str:
    if label in ("UNAVAILABLE", "SKIPPED", "NOT RUN", "HANG/DIED"):
        return "not run"
    if expect is None:
        return "(no prediction)"
    hit = not label.startswith(expect[1:]) if expect.startswith("!") else label.startswith(expect)
    return "as predicted" if hit else f"NOT AS PREDICTED ({expect})"


def run_variation(v: Variation, findings: Path, device: str) -> dict:
    """One variation, every exception recorded: CRASH:<type> (at file:line), Unsupported as UNSUPPORTED."""
    row = {"finding": v.finding, "group": v.group, "variation": v.name, "label": "", "ratio": None, "note": ""}
    start = time.perf_counter()
    try:
        base, row["source"] = base_case(v.finding, findings)
        case = base.replace(**v.change)
        row["case"] = case.to_dict()
        label, ratio, note = v.runner(case, device)
        row.update(label=label, ratio=ratio, note=note)
    except Exception as e:  # recorded, never raised: the run goes on
        where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        if type(e).__name__ == "Unsupported":
            row.update(label="UNSUPPORTED", note=str(e)[:300])
        elif isinstance(e, ImportError):
            row.update(label="UNAVAILABLE", note=f"{e} (the library does not import here)")
        else:
            at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
            row.update(label=f"CRASH:{type(e).__name__}", note=f"{str(e)[:300]}{at}")
    row["outcome"] = outcome(row["label"], v.expect)
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def line(row: dict) -> str:
    ratio = "" if row.get("ratio") is None else f"ratio={row['ratio']:.3g}"
    source = row.get("source", "")
    note = " ".join(str(row.get("note", "")).split())[:260] + ("" if source.startswith("case:") else f" [{source}]")
    return (f"{row['finding']:<3} {row['group']:<10} {row['variation'][:52]:<52} {row['label'][:24]:<24} "
            f"{ratio:<13} {row['outcome']:<34} {note}")


def child(group: str, findings: Path, out: Path, deadline: float, device: str, only: set[str]) -> None:
    """Run one group's variations in order, appending each row to out/verify.jsonl as it finishes."""
    for v in variations():
        if v.group != group or (only and v.finding not in only):
            continue
        if time.time() > deadline:
            row = {"finding": v.finding, "group": group, "variation": v.name, "label": "SKIPPED", "ratio": None,
                   "note": "over the group's share of the budget", "outcome": "not run"}
        else:
            (out / f"{group}.inflight").write_text(json.dumps({"finding": v.finding, "variation": v.name}))
            row = run_variation(v, findings, device)
        with (out / "verify.jsonl").open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(line(row), flush=True)
    (out / f"{group}.inflight").unlink(missing_ok=True)


def record_lost(out: Path, group: str, only: set[str], failure: str) -> None:
    """Rows for a child that died or hung: HANG/DIED for the variation in flight, NOT RUN for those after it."""
    path, inflight = out / "verify.jsonl", out / f"{group}.inflight"
    done = {(r["finding"], r["variation"]) for r in map(json.loads, path.read_text().splitlines())} \
        if path.exists() else set()
    lost = json.loads(inflight.read_text()) if inflight.exists() else {}
    inflight.unlink(missing_ok=True)
    for v in variations():
        if v.group != group or (only and v.finding not in only) or (v.finding, v.name) in done:
            continue
        in_flight = (v.finding, v.name) == (lost.get("finding"), lost.get("variation"))
        row = {"finding": v.finding, "group": group, "variation": v.name, "ratio": None, "outcome": "not run",
               "label": "HANG/DIED" if in_flight else "NOT RUN", "note": failure if in_flight else "after it"}
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(line(row), flush=True)


def summarize(out: Path) -> str:
    rows = [json.loads(x) for x in (out / "verify.jsonl").read_text().splitlines()] if (out / "verify.jsonl").exists() \
        else []
    text = []
    for finding in sorted({r["finding"] for r in rows}, key=lambda f: (f[0], int(f[1:]) if f[1:].isdigit() else 0)):
        mine = [r for r in rows if r["finding"] == finding]
        hits = sum(r["outcome"] == "as predicted" for r in mine)
        predicted = sum(r["outcome"] not in ("", "(no prediction)", "not run") for r in mine)
        text.append(f"== {finding}: {HEADLINES.get(finding, '')}")
        not_run = sum(r["outcome"] == "not run" for r in mine)
        text.append(f"   {hits} of {predicted} predictions held" + (f", {not_run} not run" if not_run else ""))
        text += ["   " + line(r) for r in mine]
    return "\n".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--findings", type=Path, required=True, help="corpus folder of the run (shrunk cases)")
    parser.add_argument("--out", type=Path, required=True, help="folder for verify.jsonl and summary.txt")
    parser.add_argument("--only", default="", help="comma-separated findings, e.g. F5,F6 (default: all)")
    parser.add_argument("--budget-s", type=float, default=210.0,
                        help="wall-clock budget; a hung group is killed at most HARD_MARGIN_S past it")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    only = {f.strip() for f in args.only.split(",") if f.strip()}
    if not args.findings.is_dir():
        parser.error(f"--findings={args.findings}: not a folder; pass the corpus folder of the GPU run")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args.child, args.findings, args.out, args.deadline, args.device, only)
        return
    (args.out / "verify.jsonl").unlink(missing_ok=True)
    end = time.time() + args.budget_s
    groups = [g for g in GROUPS if any(v.group == g and (not only or v.finding in only) for v in variations())]
    for i, group in enumerate(groups):
        deadline = max(end - sum(RESERVE_S[g] for g in groups[i + 1:]), time.time() + 10.0)
        cmd = [sys.executable, __file__, "--child", group, "--findings", str(args.findings), "--out", str(args.out),
               "--deadline", str(deadline), "--device", args.device, "--only", args.only]
        try:
            done = subprocess.run(cmd, timeout=max(min(deadline + GRACE_S, end + HARD_MARGIN_S) - time.time(), 1.0))
            failure = None if done.returncode == 0 else f"the {group} child process exited {done.returncode}"
        except subprocess.TimeoutExpired:
            failure = f"the {group} child did not end within its budget and was killed"
        if failure:
            record_lost(args.out, group, only, failure)
    summary = summarize(args.out)
    (args.out / "summary.txt").write_text(summary + "\n")
    print("\n" + summary)


if __name__ == "__main__":
    main()
