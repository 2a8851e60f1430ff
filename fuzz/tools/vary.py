"""Run a saved case over a grid of field changes: `attnfuzz vary ENTRY --set FIELD=V1,V2 ...`.

Triage asks the same questions of every finding: does it fail without GQA, at head dim 32, without the varlen call,
in bf16? `vary` answers them in one command. Each `--set FIELD=V1,V2,...` names a Case field and the values to try
(JSON where they parse: 8, true, null, [4, 4]; a bare word is a string); several --set flags make the cartesian
product (`--each`: one change at a time), and the case as saved runs first. A change that breaks a rule of the case
language is listed as invalid with the rule, not run. Each variant runs through the backend's isolated worker by
default, so a fault or a hang costs that variant only, and `--runs N` runs each N times (a flaky bug shows as mixed
labels). ENTRY is a corpus entry, or a JSON file holding a case (then --backend names the backend). Nothing is
saved: what it shows goes into the entry's note, or `attnfuzz known --when`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from pathlib import Path

from attnfuzz.engine import options
from attnfuzz.oracles import verdict as V
from attnfuzz.store import corpus as corpus_io
from attnfuzz.strategies.case import Case

FIELDS = tuple(f.name for f in dataclasses.fields(Case))
MESSAGE_CHARS = 110   # of each verdict's message in the table (--json keeps it whole)


def add_parser(sub) -> None:
    p = sub.add_parser("vary", help="run a saved case over a grid of field changes, each in an isolated worker: "
                       "which changes keep the failure")
    p.add_argument("entry", type=Path, help="a corpus entry (.json), or a JSON file holding a case")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=V1,V2",
                   help="a Case field and the values to try (JSON where they parse); repeat for a product")
    p.add_argument("--backend", help="the backend to run (default: the entry's; needed for a bare case)")
    p.add_argument("--each", action="store_true", help="change one field at a time from the saved case, not the "
                   "product of the --set flags")
    p.add_argument("--runs", type=options.count, default=1, help="runs of each variant (default 1)")
    p.add_argument("--json", action="store_true", help="print every variant's verdicts as JSON")
    options.add(p, "device", "no-isolate", "case-timeout", case_timeout={"default": 120.0},
                device={"default": None, "help": "default: the entry's device (cpu for a bare case)"},
                no_isolate={"help": "run the variants in this process (a fault then ends the command)"})


def split_values(text: str) -> list[str]:
    """`text` split at the commas outside brackets and quotes: '8,[4, 4],null' -> ['8', '[4, 4]', 'null']."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "[{":
            depth += 1
        elif not quoted and ch in "]}":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            parts.append(text[start:i])
            start = i + 1
    return [p.strip() for p in [*parts, text[start:]]]


def parse_set(text: str) -> tuple[str, list]:
    """'FIELD=V1,V2' -> (FIELD, [values]); ValueError naming the flag and the fix."""
    field, sep, values = text.partition("=")
    field = field.strip()
    if not sep or not values.strip():
        raise ValueError(f"--set {text!r}: give FIELD=V1,V2,... (e.g. --set d_qk=8,32 --set window=[4,4],null)")
    if field not in FIELDS:
        raise ValueError(f"--set {text!r}: {field!r} is not a Case field; the fields are {', '.join(FIELDS)}")
    out = []
    for raw in split_values(values):
        try:
            out.append(json.loads(raw))
        except json.JSONDecodeError:
            out.append(raw)   # a bare word: a string value (bfloat16, thd, bottom_right)
    return field, out


def variants(base: Case, sets: list[tuple[str, list]], each: bool = False) -> list[tuple[dict, Case | str]]:
    """The base case (no changes), then each combination of the sets' values applied to it (`each`: each value
    alone): (changes, the case, or why the case language refuses it). A field set twice takes both flags' values."""
    grid: dict[str, list] = {}
    for field, values in sets:
        grid.setdefault(field, []).extend(values)
    out: list[tuple[dict, Case | str]] = [({}, base)]
    if each:
        changed = [{field: value} for field, values in grid.items() for value in values]
    else:
        changed = [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())] if grid else []
    for changes in changed:
        try:
            out.append((changes, Case.from_dict({**base.to_dict(), **changes})))
        except ValueError as e:
            out.append((changes, str(e)))
    return out


def _load(path: Path, backend_name: str | None) -> corpus_io.Entry:
    """The corpus entry at `path` (its backend replaced by `backend_name` where given), or an entry made for the case a
    JSON file holds; ValueError (CorpusError too) says what is wrong."""
    try:
        entry = corpus_io.load(path)
        return dataclasses.replace(entry, backend=backend_name) if backend_name else entry
    except corpus_io.CorpusError as not_entry:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            raise not_entry from None   # neither an entry nor JSON: the entry's error says why
        if not backend_name:
            raise ValueError(f"{path}: not a corpus entry; for a bare case give --backend NAME") from None
        case = Case.from_dict(data.get("case", data) if isinstance(data, dict) else data, where=str(path))
        return corpus_io.Entry(backend_name, case, V.Verdict(V.PASS), device="")


def _describe(changes: dict) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in changes.items()) or "(as saved)"


def cmd_vary(args) -> int:
    from attnfuzz.engine.harness import run_case
    from attnfuzz.engine.isolate import isolated
    from attnfuzz.store.replay import backend_of
    try:
        sets = [parse_set(s) for s in args.sets]
        entry = _load(args.entry, args.backend)
        name, base, device = entry.backend, entry.case, args.device or entry.device or "cpu"
        backend = backend_of(entry, device)   # a bring-your-own kernel from the folder the entry recorded
    except ValueError as e:   # CorpusError too
        print(f"attnfuzz vary: {e}", file=sys.stderr)
        return 2
    worker = isolated(backend, device, args.case_timeout, enabled=not args.no_isolate)
    why = None if worker is not None else backend.available()
    if why is not None:
        print(f"attnfuzz vary: {name} is not available on {device}: {why}", file=sys.stderr)
        return 2
    run = worker.run if worker is not None else (lambda c: run_case(backend, c, device=device))
    rows = []
    try:
        grid = variants(base, sets, args.each)
        print(f"{name} on {device}: {len(grid)} variants of {args.entry.name}, {args.runs} run(s) each", flush=True)
        width = max(len(_describe(changes)) for changes, _ in grid)
        for changes, case in grid:
            verdicts = [run(case) for _ in range(args.runs)] if isinstance(case, Case) else []
            rows.append({"changes": changes, "invalid": None if verdicts else case,
                         "verdicts": [dict(label=v.label, ratio=v.ratio, message=v.message) for v in verdicts]})
            print(f"  {_describe(changes):<{width}}  {_summary(case, verdicts)}", flush=True)
    finally:
        if worker is not None:
            worker.close()
    if args.json:
        print(json.dumps({"backend": name, "device": device, "entry": str(args.entry), "variants": rows}, indent=1))
    return 0


def _summary(case: Case | str, verdicts: list[V.Verdict]) -> str:
    if not verdicts:
        return f"invalid: {case}"
    labels = "/".join(dict.fromkeys(v.label for v in verdicts))
    worst = max(verdicts, key=lambda v: (v.failed, v.ratio or 0.0))
    ratio = f"  {worst.ratio:.3g}" if worst.ratio else ""
    shown = worst.failed or worst.status == V.UNSUPPORTED   # what failed, or why the backend refused it
    message = f"  {worst.message[:MESSAGE_CHARS]}" if worst.message and shown else ""
    return f"{labels}{ratio}{message}".replace("\n", " ")
