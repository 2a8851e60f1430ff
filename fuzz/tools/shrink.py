"""Shrink a saved case without Hypothesis: `attnfuzz shrink ENTRY`.

Hypothesis shrinks what it finds itself. A corpus entry can arrive unshrunk: a case recovered after the fuzzing
process died on it (CRASH:PROCESS_DIED), one saved from a campaign log, or one found on another stack. This walks
such a case toward the plainest one that still fails the same way: it tries simpler cases one field at a time (the
switches off, then fewer sequences, shorter lengths, fewer heads, no shared pages, smaller pages, smaller head dims) and keeps each change under which
the backend still fails with the same label (or, for a known bug, one of its `labels`; and still fits its `match`
and `when`; a FAIL at least twice its bound, or as far past it as the case it started from: reshrink.as_clear),
until no change keeps it. The case it ends on is run three more times, as the fuzzer confirms a
finding: one that does not fail the same way every time is saved FLAKY (a known FLAKY bug that passes a replay is
unreproduced, not fixed). Each run goes through the backend's isolated worker when asked, so a crash or a hang costs
one run.
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import inflight as inflight_io
from attnfuzz.store.known import known_bugs_of
from attnfuzz.store.replay import backend_of
from attnfuzz.engine import options
from attnfuzz.oracles import verdict as V
from attnfuzz.engine.reshrink import as_clear, candidates, shrink  # noqa: F401  (candidates: the steps, for tests)
from attnfuzz.strategies.case import Case


def add_parser(sub) -> None:
    p = sub.add_parser("shrink", help="shrink a corpus entry's case to the plainest one that still fails the same "
                       "way; saves it beside the entry")
    p.add_argument("entry", type=Path, help="a corpus entry (.json)")
    options.add(p, "device", "isolate", "case-timeout", "poison-memory",
                device={"default": None, "help": "default: the entry's device"}, case_timeout={"default": 120.0})
    p.add_argument("--max-runs", type=options.count, default=400, help="the most cases to run (default 400)")


def cmd_shrink(args) -> int:
    from attnfuzz.engine.harness import run_case
    from attnfuzz.engine.isolate import isolated
    try:
        entry = corpus_io.load(args.entry)
        device = args.device or entry.device
        backend = backend_of(entry, device)  # a bring-your-own kernel: from the folder the entry recorded, if need be
    except (corpus_io.CorpusError, ValueError) as e:
        print(f"attnfuzz shrink: {e}", file=sys.stderr)
        return 2
    why = None if args.isolate else backend.available()  # an isolated worker judges it in its own process
    if why is not None:
        print(f"attnfuzz shrink: {entry.backend} is not available on {device}: {why}", file=sys.stderr)
        return 2
    worker = isolated(backend, device, args.case_timeout, enabled=args.isolate)
    run = worker.run if worker is not None else (lambda c: run_case(backend, c, device=device))
    try:
        return _shrink_entry(args, entry, run, device, backend.version())
    finally:
        if worker is not None:
            worker.close()


CONFIRM_RUNS = 3  # runs of the shrunk case after the one that kept it, as attnfuzz.engine.harness.fuzz reruns a finding


def _shrink_entry(args, entry: corpus_io.Entry, run, device: str, version: str) -> int:
    from attnfuzz.engine.harness import Finding, confirm
    first = run(entry.case)
    if not first.failed:
        print(f"{args.entry}: the case does not fail here ({first.label}{': ' + first.message if first.message else ''}); "
              "nothing to shrink", file=sys.stderr)
        return 1
    bug = entry.known_bug
    fits = known_bugs_of([(args.entry, entry)]) if bug else (lambda *_: True)
    labels = {first.label, *(bug or {}).get("labels", ())}   # a known bug's other labels are the same failure

    def fails(case: Case) -> V.Verdict | None:
        verdict = run(case)
        same = verdict.label in labels and fits(entry.backend, case, verdict) and as_clear(verdict, first)
        return verdict if same else None

    steps = lambda case, verdict: print(f"  still {verdict.label}: {case!r}", file=sys.stderr)  # noqa: E731
    small, verdict, runs = shrink(entry.case, fails, max_runs=args.max_runs, on_step=steps)
    # a stopped case (corpus/.stopped/, no verdict of its own) that fails here becomes a finding of the corpus
    stopped = entry.verdict.status == V.STOPPED
    target = args.entry.parent.parent if stopped and args.entry.parent.name == inflight_io.STOPPED_DIR \
        else args.entry.parent
    if verdict is None and not stopped:
        print(f"{args.entry}: {first.label}, already minimal ({runs} simpler cases tried, none fails the same way)")
        return 0
    small, verdict = (small, verdict) if verdict is not None else (entry.case, first)
    # confirmed as the fuzzer confirms a finding: a case that does not fail the same way every time is FLAKY
    verdict = confirm(Finding(entry.backend, small, verdict), run, CONFIRM_RUNS).verdict
    runs += CONFIRM_RUNS
    note = f"shrunk by `attnfuzz shrink` from {args.entry.name} ({runs} runs)"
    known = dict(bug, note=f"{bug.get('note', '')} [{note}]".strip()) if bug else None
    if known and known.get("labels"):  # the entry's own label may be another now: the bug still answers to each
        known["labels"] = sorted({entry.verdict.label, *known["labels"]} - {verdict.label, verdict.diagnosis})
    shrunk = corpus_io.Entry(backend=entry.backend, case=small, verdict=verdict, device=device,
                             backend_version=version, known_bug=known)
    path = corpus_io.save(target, shrunk)
    after = (f"the stopped case it came from can go: rm {args.entry} {args.entry.with_suffix('.py')}" if stopped
             else f"remove {args.entry.name} if it is the same bug")
    print(f"{first.label}: {entry.case!r}\n  -> {small!r}\n  saved as {path} ({runs} runs); {after}")
    return 0
