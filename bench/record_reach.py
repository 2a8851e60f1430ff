"""How often a search draws each known bug's condition: per backend, the share of a run's logged cases that meet the
`when` of each of its known-bug records, and how many of those were graded (run, not refused).

    python3 bench/record_reach.py LOG_SOURCE [LOG_SOURCE ...] [--corpus DIR] [--json]
    python3 bench/record_reach.py --draw fa4 --draw te-fused --device cuda [--cases 2000] [--seed 0]

A LOG_SOURCE is a campaign directory (its cases/*.jsonl), a folder of case logs (`attnfuzz run --log`), or one log.
The records are read from --corpus (default corpus/) with the attnfuzz installed here, so logs of an older build are
measured by today's records. A record's condition is necessary, not sufficient: a bug that fires on part of it
(an offset-storage fault on some offsets) is met less often than its condition. Records without a `when` take every
case of their backend and are left out. Read beside bench/recall.py: a record met in 1 % of the cases needs about a
hundred cases before the search can find it, whatever the build. A record whose labels are all GRADIENT is
measured with `grads` on too, which its bug needs whatever its `when` says.

`--draw BACKEND` measures the cases `attnfuzz run` would draw for a backend instead of a log, without running them
(bench/combos.py's drawing: the device's default Space, one seed, no compiled configuration to draw from), a case
the backend's capability rules refuse counted as not graded. On a machine without the device it measures the GPU
backends whose rules do not ask it (FA4, TE and FlashInfer read the architecture from a table); SDPA's and flex's
refuse every case there.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from attnfuzz.engine.skip_known import answered_unrun
from attnfuzz.oracles import verdict as V
from attnfuzz.store import caselog
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store.known import _labels, meets, when_fields
from attnfuzz.strategies.case import Case


def conditions(corpus: Path) -> dict[str, list[tuple[str, dict]]]:
    """Backend -> [(entry name, its record's when)], for the records that state one."""
    entries, errors = corpus_io.load_all(corpus)
    if errors:
        raise SystemExit(f"record_reach.py: error: {errors[0]}")
    by = defaultdict(list)
    for path, entry in entries:
        when = (entry.known_bug or {}).get("when")
        if when:
            labels = _labels(entry.verdict, entry.known_bug)
            needs_grads = all(label.endswith(":" + V.GRADIENT) or label == V.GRADIENT for label in labels)
            by[entry.backend].append((path.stem, {**when, "grads": True} if needs_grads else when))
    return by


def drawn_rows(backend_name: str, device: str, cases: int, seed: int) -> list[dict]:
    """Log-like rows of the cases `attnfuzz run` draws for a backend, refused ones labelled UNSUPPORTED."""
    from attnfuzz.backends import get
    from attnfuzz.strategies.space import Space
    sys.path.append(str(Path(__file__).resolve().parents[1]))   # bench.combos, wherever this file is run from
    from bench.combos import drawn
    backend = get(backend_name, device)
    return [{"backend": backend_name, "case": c.to_dict(),
             "label": V.UNSUPPORTED if backend.unsupported(c) is not None else V.PASS}
            for c in drawn(backend, Space.for_device(device), cases, seed)]


def reach(rows, records: dict[str, list[tuple[str, dict]]]) -> dict:
    """Per backend: cases, and per record the cases meeting its condition and the graded ones among them. A case
    this build cannot read (a field it does not know) is counted apart."""
    out = defaultdict(lambda: {"cases": 0, "unreadable": 0, "records": {}})
    for row in rows:
        backend = row.get("backend")
        if backend not in records:
            continue
        tally = out[backend]
        try:
            fields = when_fields(Case.from_dict(row["case"]))
        except ValueError:
            tally["unreadable"] += 1
            continue
        tally["cases"] += 1
        graded = row.get("label") != V.UNSUPPORTED and not answered_unrun(str(row.get("message", "")))
        for name, when in records[backend]:
            met = tally["records"].setdefault(name, {"when": when, "met": 0, "graded": 0})
            if meets(when, fields):
                met["met"] += 1
                met["graded"] += graded
    return dict(out)


def show(source: str, result: dict) -> str:
    lines = [f"== {source}"]
    for backend, tally in sorted(result.items()):
        extra = f", {tally['unreadable']} not readable here" if tally["unreadable"] else ""
        lines.append(f"{backend}: {tally['cases']} cases{extra}")
        for name, met in sorted(tally["records"].items()):
            share = met["met"] / tally["cases"] if tally["cases"] else 0.0
            lines.append(f"  {name:<55} {share:7.2%}  ({met['met']} met, {met['graded']} graded)  "
                         f"{json.dumps(met['when'], sort_keys=True)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sources", nargs="*", metavar="LOG_SOURCE")
    p.add_argument("--draw", action="append", default=[], metavar="BACKEND",
                   help="measure the cases drawn for BACKEND instead of a log (repeatable)")
    p.add_argument("--device", default="cpu", help="the device --draw draws for (default cpu)")
    p.add_argument("--cases", type=int, default=2000, help="cases --draw draws per backend (default 2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parents[1] / "corpus")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    for source in args.sources:
        if not Path(source).exists():
            print(f"record_reach.py: error: {source}: no such campaign, folder or log", file=sys.stderr)
            return 2
    if not args.corpus.is_dir():
        print(f"record_reach.py: error: --corpus {args.corpus}: not a folder", file=sys.stderr)
        return 2
    if args.cases <= 0:
        print(f"record_reach.py: error: --cases {args.cases}: give 1 or more", file=sys.stderr)
        return 2
    if not args.sources and not args.draw:
        print("record_reach.py: error: give a LOG_SOURCE or --draw BACKEND", file=sys.stderr)
        return 2
    records = conditions(args.corpus)
    results = {}
    for name in args.draw:
        try:
            rows = drawn_rows(name, args.device, args.cases, args.seed)
        except ValueError as e:   # an unknown backend name
            print(f"record_reach.py: error: --draw {name}: {e}", file=sys.stderr)
            return 2
        results[f"{name}: {args.cases} drawn on {args.device}"] = reach(rows, records)
    for source in args.sources:
        rows = (row for path in caselog.log_files(Path(source)) for row in caselog.rows(path))
        results[source] = reach(rows, records)
    print(json.dumps(results, indent=1) if args.json else "\n".join(show(s, r) for s, r in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
