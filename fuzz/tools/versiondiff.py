"""Version diff: replay the same cases on two stacks (e.g. TE 2.20 and 2.21) and say what changed.

    attnfuzz snapshot corpus campaign/ --label te-2.20 --out te-2.20.json     # on the old stack
    attnfuzz snapshot corpus campaign/ --label te-2.21 --out te-2.21.json     # on the new one
    attnfuzz diff te-2.20.json te-2.21.json      # exit 1 when a case newly fails or fails differently

A snapshot holds, per (backend, case), the verdict label this stack gives, with the stack's versions. The cases come
from corpus entries and from campaign case logs (failures first, then passes, up to --max-cases per backend). Each
backend runs in an isolated worker, so a stack that crashes costs one case.
"""

from __future__ import annotations

import json
import platform
import sys
from collections import defaultdict
from pathlib import Path

from attnfuzz.store import caselog
from attnfuzz.engine import options
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import paths
from attnfuzz.engine.isolate import isolated
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

FAILED = V.FAILED + (V.KNOWN,)


def add_parsers(sub) -> None:
    snap = sub.add_parser("snapshot", help="replay corpus entries and campaign cases on this stack, for `diff`")
    snap.add_argument("sources", nargs="+", type=Path, help="corpus folders or entries, campaign directories")
    snap.add_argument("--out", type=Path, required=True, help="where the snapshot JSON goes")
    snap.add_argument("--label", default="", help="a name for this stack, e.g. te-2.21")
    snap.add_argument("--device", help="run here instead of each case's own device (default: cpu for campaign "
                      "cases, the entry's device for corpus entries)")
    snap.add_argument("--max-cases", type=options.count, default=500, help="campaign cases per backend (default 500)")
    options.add(snap, "case-timeout", case_timeout={"default": 120.0})
    diff = sub.add_parser("diff", help="compare two snapshots; exit 1 when a case newly fails or fails differently")
    diff.add_argument("old", type=Path)
    diff.add_argument("new", type=Path)
    diff.add_argument("--json", action="store_true")


def _is_failure(label: str) -> bool:
    return label.split(":")[0] in FAILED


def gather(sources: list[Path], max_cases: int) -> dict[tuple[str, str], tuple[str, Case]]:
    """(backend, case JSON) -> (device, Case) from corpus entries and campaign logs; failures are taken first."""
    found: dict[tuple[str, str], tuple[str, Case]] = {}
    for source in sources:
        if not source.exists():
            raise ValueError(f"snapshot: {source} does not exist; give corpus folders, entries or campaign dirs")
        logs = sorted((source / "cases").glob("*.jsonl")) if source.is_dir() else []
        if logs:
            device = json.loads((source / "campaign.json").read_text()).get("device", "cpu")
            rows = [row for log in logs for row in caselog.rows(log)]
            rows.sort(key=lambda r: not _is_failure(r["label"]))
            per_backend: dict[str, int] = defaultdict(int)
            for row in rows:
                key = (row["backend"], json.dumps(row["case"], sort_keys=True))
                if key in found or per_backend[row["backend"]] >= max_cases:
                    continue
                per_backend[row["backend"]] += 1
                found[key] = (device, Case.from_dict(row["case"]))
            continue
        paths = corpus_io.entry_paths(source) if source.is_dir() else [source]
        for path in paths:
            entry = corpus_io.load(path)
            found.setdefault((entry.backend, json.dumps(entry.case.to_dict(), sort_keys=True)),
                             (entry.device, entry.case))
    return found


def snapshot(sources: list[Path], *, label: str = "", device: str | None = None, max_cases: int = 500,
             case_timeout: float = 120.0) -> dict:
    """Run every gathered case on this stack; the stack's versions and one result per case."""
    import torch
    from attnfuzz.backends import get
    from attnfuzz.engine.harness import run_case
    cases = gather(sources, max_cases)
    results, versions, adapters, workers, unavailable = [], {}, {}, {}, {}
    try:
        for (backend, case_json), (own_device, case) in sorted(cases.items()):
            where = device or own_device
            if (backend, where) not in adapters:
                adapter = adapters[backend, where] = get(backend, where)
                versions[backend] = adapter.version()
                worker = workers[backend, where] = isolated(adapter, where, case_timeout)
                # once per backend, where its cases run: TE imports in a fresh worker, not after cuDNN loaded here
                unavailable[backend, where] = (worker or adapter).available()
            adapter, worker, why = adapters[backend, where], workers[backend, where], unavailable[backend, where]
            if why is not None:
                results.append({"backend": backend, "case": json.loads(case_json), "label": "UNAVAILABLE",
                                "message": why})
                continue
            verdict = worker.run(case) if worker is not None else run_case(adapter, case, device=where)
            results.append({"backend": backend, "case": json.loads(case_json), "label": verdict.label,
                            "message": verdict.message[:300]})
    finally:
        for worker in workers.values():
            if worker is not None:
                worker.close()
    return {"label": label, "stack": {"torch": torch.__version__, "python": platform.python_version(),
                                      "backends": versions}, "results": results}


def diff(old: dict, new: dict) -> dict[str, list[dict]]:
    """What changed between two snapshots, by (backend, case): newly failing, newly passing, changed diagnosis,
    newly refused (UNSUPPORTED / UNAVAILABLE), newly accepted, and the cases only one side ran."""
    def index(snap):
        return {(r["backend"], json.dumps(r["case"], sort_keys=True)): r for r in snap["results"]}

    before, after = index(old), index(new)
    changes: dict[str, list[dict]] = {k: [] for k in ("newly failing", "newly passing", "changed diagnosis",
                                                      "newly refused", "newly accepted", "only old", "only new")}
    refused = ("UNSUPPORTED", "UNAVAILABLE")
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key), after.get(key)
        if a is None or b is None:
            changes["only new" if a is None else "only old"].append(a or b)
            continue
        row = {"backend": key[0], "case": a["case"], "old": a["label"], "new": b["label"], "message": b["message"]}
        la, lb = a["label"].split(":")[0], b["label"].split(":")[0]
        if a["label"] == b["label"]:
            continue
        if la in refused or lb in refused:
            changes["newly refused" if lb in refused else "newly accepted"].append(row)
        elif _is_failure(a["label"]) and _is_failure(b["label"]):
            changes["changed diagnosis"].append(row)
        elif _is_failure(b["label"]):
            changes["newly failing"].append(row)
        elif _is_failure(a["label"]):
            changes["newly passing"].append(row)
    return changes


def markdown(old: dict, new: dict, changes: dict[str, list[dict]]) -> str:
    def stack(s):
        backends = ", ".join(f"{k} {v}" for k, v in sorted(s["stack"]["backends"].items()) if v)
        return f"{s['label'] or '(unnamed)'}: torch {s['stack']['torch']}{'; ' + backends if backends else ''}"

    lines = ["# attnfuzz diff", "", f"- old: {stack(old)}", f"- new: {stack(new)}",
             f"- cases: {len(old['results'])} old, {len(new['results'])} new", ""]
    for kind, rows in changes.items():
        lines.append(f"## {kind}: {len(rows)}")
        for row in rows[:50]:
            case = Case.from_dict(row["case"])
            if "old" in row:
                lines.append(f"- {row['backend']}: {row['old']} -> {row['new']}  `{case!r}`")
            else:
                lines.append(f"- {row['backend']}: {row['label']}  `{case!r}`")
        if len(rows) > 50:
            lines.append(f"- ... and {len(rows) - 50} more (--json lists all)")
        lines.append("")
    return "\n".join(lines)


def cmd_snapshot(args) -> int:
    paths.writable_file(args.out, "--out", "snapshot.json")  # before the cases run, not after
    try:
        snap = snapshot(args.sources, label=args.label, device=args.device, max_cases=args.max_cases,
                        case_timeout=args.case_timeout)
    except (ValueError, corpus_io.CorpusError) as e:
        print(f"attnfuzz snapshot: {e}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(snap, indent=1) + "\n")
    labels = defaultdict(int)
    for r in snap["results"]:
        labels[r["label"].split(":")[0]] += 1
    print(f"{args.out}: {len(snap['results'])} cases on {snap['label'] or 'this stack'}: {dict(labels)}",
          file=sys.stderr)
    return 0


def cmd_diff(args) -> int:
    try:
        old, new = (json.loads(p.read_text()) for p in (args.old, args.new))
    except (OSError, ValueError) as e:  # missing, not JSON, not UTF-8
        print(f"attnfuzz diff: cannot read a snapshot ({e}); make them with `attnfuzz snapshot`", file=sys.stderr)
        return 2
    changes = diff(old, new)
    print(json.dumps(changes, indent=1) if args.json else markdown(old, new, changes))
    return 1 if changes["newly failing"] or changes["changed diagnosis"] else 0
