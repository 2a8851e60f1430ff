"""attnfuzz command line: run, campaign, report, snapshot, diff, replay, known, triage, shrink, vary, backends.

Exit codes: 0 nothing found, 1 a failure found, 2 bad usage."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from attnfuzz import exits
from attnfuzz.progress import CaseLog, Progress
from attnfuzz.exits import UsageError
from attnfuzz.tools import bugreport, known, shrink, vary, versiondiff
from attnfuzz.campaign import supervisor as campaign
from attnfuzz.report import catalog, build as report, triage
from attnfuzz.report.combos import Combos, describe, feasible_of
from attnfuzz.engine import interrupt, options, poison
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import inflight as inflight_io
from attnfuzz.store import examples, paths
from attnfuzz.store.known import TRAITS, predates
from attnfuzz.store import replay as replay_io
from attnfuzz.backends import factories, get
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.isolate import Workers, isolated
from attnfuzz.engine.profiles import for_backend, profile
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.verdict import Verdict
from attnfuzz.strategies.features import NAMES
from attnfuzz.strategies.space import Space

DEFAULT_BACKENDS = ("sdpa-math", "sdpa-flash", "flex-eager")  # the embedded default: CPU, small


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnfuzz", description="Property-based differential fuzzer for attention "
                                "kernels, graded against an independent float64 oracle.")
    p.add_argument("--version", action="version", version=f"attnfuzz {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="fuzz backends; exit 1 when a failure is found")
    options.add(run, "backend", "max-examples", "seed", "device", "corpus", "profile", "max-len", "threads",
                "first-bug", "isolate", "no-isolate", "case-timeout", "poison-memory", "skip-unavailable",
                "compile-time-share",
                backend={"help": "registry name or package.module:function (repeatable; default: "
                                 f"{', '.join(DEFAULT_BACKENDS)})"})
    run.add_argument("--log", type=Path, help="append one JSON line per case run (case, whole verdict, seconds) here")
    run.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    replay = sub.add_parser("replay", help="replay corpus entries; exit 1 when one regressed, 2 when "
                            "one cannot be read")
    replay.add_argument("paths", nargs="*", type=Path, help="entry files or folders (default: the shipped corpus "
                        "and the findings folder of --corpus)")
    options.add(replay, "corpus", "device", "isolate", "case-timeout", "poison-memory",
                device={"default": None, "help": "run on this device instead of the entry's own"})
    replay.add_argument("--json", action="store_true")
    mark = sub.add_parser("known", help="mark a corpus entry as a known bug (an expected failure) with its link")
    mark.add_argument("entry", type=Path, help="the corpus entry's JSON file")
    mark.add_argument("--link", required=True, help="where the bug is tracked (an issue, a PR, a source line)")
    mark.add_argument("--note", default="", help="what the bug is, in a sentence")
    mark.add_argument("--match", default="", help="count a new failure as this bug only if its message contains this")
    mark.add_argument("--when", action="append", default=[], metavar="FIELD=JSON",
                      help="count it only for cases with this field, feature or trait value, e.g. "
                           "dtype='\"float64\"' or empty_q_sequence=true (repeatable; features: " + ", ".join(NAMES)
                           + "; traits: " + ", ".join(TRAITS) + ")")
    mark.add_argument("--label", action="append", default=[], metavar="LABEL",
                      help="count failures with this verdict label too, e.g. FAIL:NONFINITE, for a bug whose output "
                           "reads 0, NaN or wrong values from run to run (repeatable)")
    campaign.add_parser(sub)
    versiondiff.add_parsers(sub)
    report.add_parser(sub)
    triage.add_parser(sub)
    shrink.add_parser(sub)
    vary.add_parser(sub)
    catalog.add_parser(sub)
    bugreport.add_parser(sub)
    backends = sub.add_parser("backends", help="list backends, whether they can run here, and why not")
    options.add(backends, "device")
    backends.add_argument("--json", action="store_true")
    return p


def version() -> str:
    """The installed distribution's version (pyproject.toml's, as pip installed it)."""
    from importlib import metadata
    try:
        return metadata.version("attnfuzz")
    except metadata.PackageNotFoundError:
        return "(unknown: not installed as a distribution)"


def _check_device(device: str) -> None:
    import torch
    if device == "cpu":
        return
    if not device.startswith("cuda"):
        raise UsageError(f"--device={device!r}: use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UsageError(f"--device={device!r}: this torch ({torch.__version__}) sees no CUDA device; use --device cpu")


def findings_option(given: Path | None) -> str:
    """How the findings folder was named, for a message: --corpus, $ATTNFUZZ_CORPUS, or neither (the default)."""
    return "--corpus" if given else "$ATTNFUZZ_CORPUS" if os.environ.get("ATTNFUZZ_CORPUS") else "the default --corpus"


def cmd_run(args) -> int:
    _check_device(args.device)
    paths.writable_folder(args.corpus, args.corpus_named)  # before the search: its findings must have a place
    if args.log is not None:
        paths.writable_file(args.log, "--log", "run.jsonl")
    import torch
    torch.set_num_threads(args.threads)
    settings = examples.kept_here(profile(args.profile, max_examples=args.max_examples,
                                          report_multiple_bugs=not args.first_bug))
    names = args.backend or [n for n in DEFAULT_BACKENDS if n in factories()]
    space = Space.for_device(args.device, args.max_len)
    conflict = options.time_share_conflict(args.compile_time_share, args.seed, settings.derandomize, args.profile)
    if conflict:
        raise UsageError(conflict)
    if args.compile_time_share:
        space = space.replace(compile_time_share=args.compile_time_share)
    backends, first_worker, unavailable = runnable(args, names)
    known = corpus_io.known_bugs(corpus_io.shipped_dir(), args.corpus)  # an unreadable corpus file stops it here
    summary, found = {}, 0
    for i, (name, backend) in enumerate(zip(names, backends)):
        if name in unavailable:
            print(f"[{name}] skipped: {unavailable[name]}", file=sys.stderr)
            summary[name] = {"skipped": unavailable[name]}
            continue
        isolate = options.isolating(args.device, args.isolate, args.no_isolate)
        worker = first_worker if i == 0 else isolated(backend, args.device, args.case_timeout, enabled=isolate)
        args.corpus.mkdir(parents=True, exist_ok=True)
        recovered = inflight_io.recover_inflight(args.corpus, backend)
        for r in recovered:
            print(f"[{name}] {r.message}", file=sys.stderr)
        saved = [r.path for r in recovered if r.finding]
        inflight = inflight_io.inflight_path(args.corpus, backend.name)
        backend_settings = for_backend(settings, backend.cost, args.max_examples)
        progress = Progress(name, backend_settings.max_examples)
        log = CaseLog(args.log, name, args.device)

        as_found = corpus_io.AsFound(name, args.device, backend.version())
        graded = Combos()

        def on_case(case, verdict, seen):
            progress.update(seen)
            log.write(case, verdict)
            as_found.see(case, verdict)
            if args.json and verdict.status != V.UNSUPPORTED:
                graded.add(case)

        try:
            tally, findings = fuzz(backend, device=args.device, space=space, settings=backend_settings,
                                   seed=args.seed, inflight=inflight, on_case=on_case,
                                   known=known, worker=worker, database_key=examples.key(backend, args.corpus))
        except interrupt.Interrupted:
            print(("\n" if progress.tty else "") + f"[{name}] interrupted: the case it was running is not a finding; "
                  f"{len(as_found.failures)} failure(s) graded before the stop saved as found", file=sys.stderr)
            for _, said in as_found.save(args.corpus, corpus_io.STOPPED_UNCONFIRMED):   # a stop loses the shrink
                print(f"[{name}] {said}", file=sys.stderr)
            raise
        finally:
            if worker is not None:
                worker.close()
            for death in getattr(worker, "unattributed", ()):  # no case's finding: said, never saved
                print(f"[{name}] {death.describe()}", file=sys.stderr)
        log.close()
        progress.update(tally, final=True)
        for line in tally.known_lines():  # which known bug each KNOWN count is
            print(f"[{name}] {line}", file=sys.stderr)
        for f in findings:
            entry = corpus_io.Entry(backend=name, case=f.case, verdict=f.verdict, device=args.device,
                                    backend_version=backend.version(), attached=f.attached)
            new = not (args.corpus / entry.filename).exists()
            saved.append(corpus_io.save(args.corpus, entry))
            print(f"[{name}] {corpus_io.describe_saved(entry, saved[-1], new=new)}", file=sys.stderr)
        # met on the way to what --first-bug shrank
        for path, said in as_found.besides(findings).save(args.corpus, corpus_io.MET_UNCONFIRMED):
            saved.append(path)
            print(f"[{name}] met before the shrunk finding, saved as found: {said}", file=sys.stderr)
        found += len(saved)
        summary[name] = {"tally": tally.to_dict(), "saved": [str(p) for p in saved],
                         "unattributed_deaths": [d.to_dict() for d in getattr(worker, "unattributed", ())]}
        if args.json:   # which feature combinations the graded cases reached, of those the backend can take
            summary[name]["combinations"] = graded.report(feasible_of(backend, space))
            print(f"[{name}] {describe(summary[name]['combinations'])}", file=sys.stderr)
        refused = f" (and {tally.refused} refused)" if tally.refused else ""
        print(f"[{name}] {tally.examples - tally.refused} examples{refused} in {tally.seconds:.1f}s; "
              f"{len(saved)} finding(s) saved to {args.corpus}", file=sys.stderr)
        if tally.batch_checked:  # the property as observed; a backend that claims it fails where it breaks
            claim = "claimed" if backend.batch_invariant else "observed, not claimed"
            print(f"[{name}] {tally.batch_line()} ({claim})", file=sys.stderr)
        if tally.not_run:
            print(f"[{name}] {tally.not_run}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary, indent=2))
    return 1 if found else 0


def runnable(args, names: list[str]) -> tuple[list, object, dict[str, str]]:
    """The backends to run, the first one's isolated worker (started first, so that it imports the backend's library
    while this process does the same to ask about availability) and why each that cannot run here cannot. A backend
    named with --backend that cannot run is bad usage unless --skip-unavailable; a run where none can is too."""
    try:
        backends = [get(name, args.device) for name in names]
    except ValueError as e:
        raise UsageError(str(e)) from None
    enabled = options.isolating(args.device, args.isolate, args.no_isolate)
    first_worker = isolated(backends[0], args.device, args.case_timeout, enabled=enabled) if backends else None
    unavailable = {name: why for name, b in zip(names, backends) if (why := b.available()) is not None}
    named = [name for name in unavailable if args.backend and not args.skip_unavailable]
    if first_worker is not None and (named or names[0] in unavailable):
        first_worker.close()
        first_worker = None
    if named:
        raise UsageError(f"--backend={named[0]} cannot run here: {unavailable[named[0]]} (or pass "
                         f"--skip-unavailable to skip it)")
    if len(unavailable) == len(names):
        raise UsageError(f"no backend can run here ({'; '.join(f'{n}: {w}' for n, w in unavailable.items())}); "
                         f"`attnfuzz backends --device {args.device}` lists what can")
    return backends, first_worker, unavailable


def replay_outcome(entry: corpus_io.Entry, verdict: Verdict) -> str:
    """'pass', 'skip', 'xfail' (a known bug still there), 'xpass' (a known bug now passes: say so loudly),
    'unreproduced' (a known FLAKY bug, or one of unwritten output replayed without --poison-memory, that did not come
    back this time: no evidence either way; cmd_replay also says it of an entry saved unconfirmed that passed),
    'predates' (it passes on a release older than the bug: store/known.py's `since`) or 'fail' (a regression)."""
    if verdict.status == V.UNSUPPORTED:
        return "skip"
    if entry.known_bug:
        if verdict.failed:
            return "xfail"
        if predates(entry.known_bug):
            return "predates"
        unwritten = entry.known_bug.get("unwritten") and not poison.enabled()
        return "unreproduced" if entry.verdict.status == V.FLAKY or unwritten else "xpass"
    return "fail" if verdict.failed else "pass"


def changed_label(entry: corpus_io.Entry, verdict: Verdict) -> str:
    """For a known bug that still fails: ' (saved as LABEL)' when it now fails otherwise (a grader change, the bug
    changing, or a second bug on the same case), else ''."""
    return f" (saved as {entry.verdict.label})" if verdict.failed and verdict.label != entry.verdict.label else ""


UNCONFIRMED_NOTES = {"confirmed": " (saved unconfirmed: reproduced, now confirmed)",
                     "dropped": f" (saved unconfirmed: not reproduced, moved to {replay_io.UNREPRODUCED_DIR}/)",
                     "still": " (saved unconfirmed: still unconfirmed)"}


def cmd_replay(args) -> int:
    entries = []
    paths.folder(args.corpus, args.corpus_named)
    shipped_and_findings = [corpus_io.shipped_dir()] + [args.corpus] * args.corpus.is_dir()
    for path in args.paths or shipped_and_findings:
        if path.is_dir():
            entries.extend(corpus_io.entry_paths(path))
        elif path.exists():
            entries.append(path)
        else:
            raise UsageError(f"replay: {path} does not exist; give corpus entry files or folders")
    if args.device:
        _check_device(args.device)
    for path in args.paths:
        if path.is_file():
            corpus_io.load(path)  # an entry named on its own that cannot be read: CorpusError, exit 2
    rows, bad, errors = [], 0, 0
    replayer = replay_io.Replayer(Workers(args.case_timeout) if args.isolate else None, args.case_timeout)
    for path in entries:
        try:
            entry = corpus_io.load(path)
        except corpus_io.CorpusError as e:  # one file of a folder: listed, and the others replayed
            rows.append({"entry": str(path), "outcome": "error", "message": str(e)})
            errors += 1
            continue
        device = args.device or entry.device
        try:
            verdict = replayer(entry, device)
        except ValueError as e:
            if ":" in entry.backend:  # the user's kernel does not import here: say how to fix it, not skip it
                rows.append({"entry": str(path), "outcome": "error", "message": str(e)})
                errors += 1
                continue
            verdict = Verdict(V.UNSUPPORTED, None, str(e))  # a backend name this attnfuzz does not know
        settled = replay_io.settle_unconfirmed(path, entry, verdict)   # an entry saved unconfirmed
        outcome = "unreproduced" if settled == "dropped" else replay_outcome(entry, verdict)
        bad += outcome in ("fail", "xpass")
        rows.append({"entry": str(path), "outcome": outcome, "verdict": verdict.label, "saved": entry.verdict.label,
                     "changed": changed_label(entry, verdict) if outcome == "xfail" else "",
                     "unconfirmed": settled or ("still" if entry.unconfirmed else None),
                     "message": predates(entry.known_bug) if outcome == "predates" else verdict.message,
                     "known_bug": entry.known_bug})
    replayer.close()
    if replayer.switched:
        print(f"replay: {replayer.switched}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            note = " KNOWN BUG NOW PASSES: mark it fixed" if row["outcome"] == "xpass" else row.get("changed", "")
            note += UNCONFIRMED_NOTES.get(row.get("unconfirmed"), "")
            message = row["message"] if row["outcome"] == "error" else row["message"][:160]  # an error: its fix
            print(f"{row['outcome']:>5}  {row['entry']}  {row.get('verdict', '')}{note}  {message}")
        print(f"{len(rows)} entries, {bad} regressed, {errors} unreadable or not importable")
    return 1 if bad else 2 if errors else 0


def cmd_backends(args) -> int:
    rows = []
    for name, factory in factories().items():
        backend = factory(args.device)
        why = backend.available()
        rows.append({"name": name, "device": args.device, "available": why is None, "why_not": why,
                     "version": backend.version() if why is None else ""})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max((len(row["name"]) for row in rows), default=0)  # the longest name sets the column
        for row in rows:
            state = f"yes  {row['version']}" if row["available"] else f"no   {row['why_not']}"
            print(f"{row['name']:<{width}}  {state}")
    return 0


def main(argv: list[str] | None = None) -> int:
    command = next((a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("-")), "")
    return exits.run(command, lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad usage, 0 on --help
        return int(e.code or 0)
    commands = {"run": cmd_run, "replay": cmd_replay, "known": known.cmd_known, "backends": cmd_backends,
                "campaign": campaign.cmd_campaign, "report": report.cmd_report, "snapshot": versiondiff.cmd_snapshot,
                "diff": versiondiff.cmd_diff, "triage": triage.cmd_triage,
                "shrink": shrink.cmd_shrink, "vary": vary.cmd_vary, "catalog": catalog.cmd_catalog,
                "report-bug": bugreport.cmd_report_bug}
    if getattr(args, "poison_memory", False):
        poison.enable()  # before any worker process or campaign lane starts, so they run with it
    if args.command in ("run", "replay"):
        args.corpus_named = findings_option(args.corpus)
        args.corpus = corpus_io.findings_dir(args.corpus)
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
