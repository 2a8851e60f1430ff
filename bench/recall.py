"""Recall: does a fuzz run find each known bug of the corpus when it is not told about it, and how soon?

    python3 bench/recall.py [--device cpu] [--entries GLOB] [--corpus DIR] [--seeds 5] [--budget-s 600]
                            [--budget-cases N] [--profile quick] [--max-examples N] [--jobs N] [--json]
                            [--compile-time-share S] [NAME=DIR ...]

For each corpus entry with a known_bug record (selected by --entries, a glob on the file name; default all) whose
backend is available on --device and which was found on that kind of device, the entry and its duplicates are held
out: every other entry of the corpus stays known, so its failures are passed over as KNOWN. A duplicate is an entry
of the same backend whose record matches the held-out entry's saved failure, or whose saved failure the held-out
entry's record matches: the two records answer for one failure at least, and the one left known would hide it.
(Links are no test: a link names a folder or a PR that several unrelated bugs share.) A failure that a held-out
record matches is never marked KNOWN, whatever other record matches it too.

Each seed is a fresh process (under the ISA a CPU entry was recorded on, ATEN_CPU_CAPABILITY, where it names one)
that fuzzes the backend, isolated (--isolate: a crash or a hang costs one case), with
the profile's settings, not derandomized and without an example database, one Hypothesis run after another with
new seeds (as a user re-runs `attnfuzz run` after a finding) until a failing verdict that a held-out record matches
(found: the cases drawn and the seconds since the process started, imports and compiles included) or the budget
(--budget-s, --budget-cases) runs out (not found). The process is killed if it outlives the budget by 60 s.

Per entry: found in k of N seeds, the median cases and seconds to the match over the seeds that found it. An entry
is recalled when found in at least half its seeds: then the lower median over all seeds, a seed that did not find
counted as never, is within the budget. Overall: the recalled entries of those run, and the median of their median
seconds and cases. Entries not run are listed with why (backend unavailable, asked in a process a backend; found on
another device; an older release). A seed that did not find its entry reports its verdicts by status and the
failures no held-out record took, by label (a new bug, or a record narrower than its bug), each label with the
smallest such case it met (`unmatched_examples` in --json; a line each in the table), to replay and look at.

--jobs N runs N seeds at once (default 1), each in its own process; on a GPU each then keeps to an equal share of
its memory (ATTNFUZZ_GPU_MEMORY_SHARE, as campaign lanes do), and the seconds to a match include the contention.

--together runs one process a seed for all the chosen entries of a backend (and of a kernel folder and an ISA): it
holds them all out at once and records the first match of each, until each is found or the budget runs out. The
search is then harder (a held-out bug is passed over as KNOWN only once a seed has met it), and it costs one
process a backend instead of one an entry: a bound from above on each entry's time, for a GPU corpus too large to
run entry by entry.

A seed passes over the failures of the records not held out as KNOWN (and answers most cases of their known crashes
unrun, engine/skip_known.py), as `attnfuzz run` does with the corpus known. A failure a held-out record takes is
printed for the parent the first time the seed meets that record's bug, then passed over too: a shrink would spend
the budget on a bug already found. From then on most cases of a held-out crash are answered unrun as well (the skip
trusts a record only once a case has shown its bug in the process; that first case is the match): each crash costs a
new worker, seconds on a GPU, which the other held-out entries' search would pay for a bug already found. The
seed's row counts the cases so answered (`unrun`).

Before the search, each chosen entry's case is replayed (`--replays`, default 3 times; a FLAKY entry fails in some
runs only) as `attnfuzz replay --isolate` replays it, one process a backend: an entry whose case passes every replay
(a bug fixed in this stack's kernel) or is refused by every one is not run, with why. No search could find it, and
counting it would measure the stack, not the search.

A/B: NAME=DIR arguments, each DIR holding an installed attnfuzz (`pip wheel --no-deps --no-build-isolation -w W .`
in a checkout, then `pip install --no-deps --target DIR W/*.whl`), run every seed of every entry once per build,
taking turns from a rotating position; each process imports attnfuzz from its DIR alone. The entries and their
duplicates are chosen with the first build (or, without builds, the attnfuzz installed here), and every seed's
failures are judged by it: a seed prints each failure it meets, and this process matches it against the held-out
records and stops the seed at the first match. So an older build, which may not read today's records, is measured by
the same yardstick; it passes over, as KNOWN, only the other records it can read.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))   # bench.recall_report, wherever this file is run or imported from
from bench.recall_child import FAILED, GRACE_S, MARK, child  # noqa: E402
from bench.recall_replay import leave_out_unreproduced  # noqa: E402
from bench.recall_report import show_all, summarize  # noqa: E402


class Stop(BaseException):
    """Ends a seed's search from inside the property: not an Exception, so Hypothesis does not shrink it."""


def plan(corpus: str, device: str, patterns: list[str], profile_name: str = "quick") -> dict:
    """The entries to run (file name -> its backend and the held-out group) and why the others are not run."""
    from attnfuzz.engine.profiles import profile
    from attnfuzz.store import corpus as corpus_io
    from attnfuzz.store.known import known_bugs_of, predates
    try:
        profile(profile_name)
    except ValueError as e:
        return {"error": str(e)}
    entries, errors = corpus_io.load_all(Path(corpus))
    if errors:
        return {"error": "; ".join(str(e) for e in errors)}
    bugs = [(p, e) for p, e in entries if e.known_bug]
    chosen = [(p, e) for p, e in bugs if any(fnmatch.fnmatch(p.name, g) or fnmatch.fnmatch(p.stem, g)
                                            for g in patterns or ["*"])]
    unmatched = [g for g in patterns if not any(fnmatch.fnmatch(p.name, g) or fnmatch.fnmatch(p.stem, g)
                                                for p, _ in bugs)]
    if unmatched:
        return {"error": f"--entries {unmatched[0]!r} matches no entry with a known_bug record in {corpus}"}
    run, not_run, kind = {}, {}, device.split(":")[0]
    asked = sorted({(e.backend, e.kernel_path) for _, e in chosen}, key=str)
    with ThreadPoolExecutor(max_workers=min(8, len(asked) or 1)) as pool:   # each waits on a process of its own
        whys = dict(zip(asked, pool.map(lambda b: child(None, "why_not", *b, device, timeout=300), asked)))
    for path, entry in chosen:
        asked_it = whys[(entry.backend, entry.kernel_path)]   # {"why": ...}, or {"error": ...} where the child failed
        why = asked_it["why"] if "why" in asked_it else asked_it["error"]
        if why is not None:
            not_run[path.name] = f"backend unavailable: {why}"
        elif entry.device.split(":")[0] != kind:
            not_run[path.name] = f"found on {entry.device}, not {device}"
        elif predates(entry.known_bug):
            not_run[path.name] = predates(entry.known_bug)
        else:
            mine = known_bugs_of([(path, entry)])
            group = [p.name for p, e in bugs if p == path or e.backend == entry.backend and (
                mine(e.backend, e.case, e.verdict) or known_bugs_of([(p, e)])(e.backend, entry.case, entry.verdict))]
            # a CPU entry recorded under a chosen ISA (an AVX2-only bug) is searched for under it (store/isa.py)
            isa = (entry.environment or {}).get("ATEN_CPU_CAPABILITY") if kind == "cpu" else None
            run[path.name] = {"backend": entry.backend, "held_out": group, **({"isa": isa} if isa else {}),
                              **({"kernel_path": entry.kernel_path} if entry.kernel_path else {})}
    return {"run": run, "not_run": not_run}


def search(corpus: str, backend_name: str, kernel_path: str | None, held_out: list[str], device: str,
           profile_name: str, max_examples: int | None, seed: int, budget_s: float, budget_cases: int | None,
           case_timeout: float, started: float, compile_time_share: float | None = None) -> dict:
    """One seed: fuzz the backend (a bring-your-own kernel imported from `kernel_path`, the folder its entry
    records), the held-out entries unknown, printing each failure (FAILED) for the parent to judge, until the budget
    runs out or the parent, having matched every entry this seed searches for, kills the process. `started`: the
    wall clock (time.time()) when the process was spawned. An older build (A/B) fuzzes with the records it can read."""
    import attnfuzz
    from attnfuzz.backends import get
    from attnfuzz.engine.harness import fuzz
    from attnfuzz.engine.isolate import isolated
    from attnfuzz.engine.profiles import for_backend, profile
    from attnfuzz.store import corpus as corpus_io
    from attnfuzz.store.known import known_bugs_of
    from attnfuzz.strategies.space import Space
    try:   # an older build (A/B) has no memory shares: its seeds share the GPU as they can
        from attnfuzz.engine.memshare import share_bytes
    except ImportError:
        share_bytes = lambda: None   # noqa: E731
    import torch
    torch.set_num_threads(1)
    entries, _ = corpus_io.load_all(Path(corpus))   # a record this build cannot read is not known to it
    held = {p.name: known_bugs_of([(p, e)]) for p, e in entries if p.name in held_out}
    rest = known_bugs_of([(p, e) for p, e in entries if p.name not in held_out])
    met: set[str] = set()

    def tell(case, verdict, number: int) -> None:
        """A failure, printed for the parent to judge (FAILED)."""
        print(FAILED + json.dumps({"case": case.to_dict(), "verdict": verdict.to_dict(), "cases": number,
                                   "seconds": round(time.time() - started, 2)}), flush=True)

    def known(backend, case, verdict):
        """The other records' failures are known, as in any run. A failure that held-out records take is printed
        for the parent the first time one of them meets it, and passed over as known: the parent has its match, and
        a shrink of it would spend the budget on a bug already found."""
        hits = {name: hit for name, take in held.items() if (hit := take(backend, case, verdict)) is not None}
        if not hits:
            return rest(backend, case, verdict)
        if set(hits) - met:
            met.update(hits)
            tell(case, verdict, cases + 1)   # (this case is counted after its verdict)
        return next(iter(hits.values()))
    if hasattr(rest, "crash_faces"):   # known crashes answered unrun as in a run (a build that can): the others',
        # and a held-out record's once this seed has met its bug (engine/skip_known.py trusts a record only after a
        # case showed its bug here, and that first case is the match the parent is told of)
        every = known_bugs_of(entries)
        known.crash_faces, known.takes = every.crash_faces, every.takes
    try:
        from attnfuzz.engine.skip_known import answered_unrun
    except ImportError:   # an older build answers nothing unrun
        answered_unrun = lambda message: False   # noqa: E731

    if kernel_path and kernel_path not in sys.path:
        sys.path.append(kernel_path)   # (a worker started later inherits it)
    backend = get(backend_name, device)
    worker = isolated(backend, device, case_timeout)
    settings = for_backend(profile(profile_name, max_examples=max_examples, derandomize=False, database=None),
                           backend.cost, max_examples)
    space, share = Space.for_device(device), share_bytes()
    if share is not None:
        space = space.replace(max_bytes=share)   # --jobs on a GPU: its share
    if compile_time_share and hasattr(space, "compile_time_share"):   # (an older build keeps its fixed share)
        space = space.replace(compile_time_share=compile_time_share)
    cases, rounds, statuses, unrun = 0, 0, Counter(), 0
    print(MARK + json.dumps({"module": attnfuzz.__file__}), flush=True)   # which attnfuzz, before any failure

    def on_case(case, verdict, tally) -> None:
        nonlocal cases, unrun
        cases += 1
        statuses[verdict.status] += 1
        unrun += answered_unrun(verdict.message)
        if verdict.failed:
            tell(case, verdict, cases)
        if time.time() - started >= budget_s or (budget_cases is not None and cases >= budget_cases):
            raise Stop()

    try:
        while time.time() - started < budget_s:
            rounds += 1
            fuzz(backend, device=device, space=space, settings=settings,
                 seed=seed * 1_000_003 + rounds, on_case=on_case, known=known, worker=worker, reruns=0)
    except Stop:
        pass
    finally:
        if worker is not None:
            worker.close()
    return {"found": False, "rounds": rounds, "cases_run": cases, "statuses": dict(statuses), "unrun": unrun,
            "module": attnfuzz.__file__}


def why_not(backend: str, kernel_path: str | None, device: str) -> dict:
    """{"why": why `backend` (a kernel of `kernel_path`) cannot run on `device`, or None}. plan asks it in a process
    a backend, as replay and versiondiff do: TransformerEngine does not import in a process where cuDNN has loaded
    (an ImportError from a system library, on an H100 runner), which would leave its entries out."""
    from types import SimpleNamespace

    from attnfuzz.store.replay import backend_of
    try:
        return {"why": backend_of(SimpleNamespace(backend=backend, kernel_path=kernel_path), device).available()}
    except Exception as e:  # an unknown name, a kernel's module that does not import
        return {"why": f"{type(e).__name__}: {e}"}


def judges(corpus: str, chosen: dict):
    """For each entry run, a function that takes a failure a seed printed and returns the found-row where the entry's
    held-out group matches it (None otherwise). The records are read here, with the first build (imported by
    main), so every build is judged by the same records."""
    from attnfuzz.oracles.verdict import Verdict
    from attnfuzz.store import corpus as corpus_io
    from attnfuzz.store.known import known_bugs_of
    from attnfuzz.strategies.case import Case
    entries, _ = corpus_io.load_all(Path(corpus))

    def judge_of(what: dict):
        held = known_bugs_of([(p, e) for p, e in entries if p.name in what["held_out"]])

        def judge(failure: dict) -> dict | None:
            try:
                case = Case.from_dict(failure["case"])
            except ValueError:   # an older build's field this one does not have: that case is no match
                return None
            verdict = Verdict.from_dict(failure["verdict"])
            hit = held(what["backend"], case, verdict)
            return None if hit is None else {"found": True, "matched": hit["id"], "label": verdict.label,
                                             "cases": failure["cases"], "seconds": failure["seconds"]}
        return judge
    return {name: judge_of(what) for name, what in chosen.items()}


def gather(judge_of: dict):
    """A judge over several entries (name -> its judge): it keeps each entry's first match in `.found`, counts the
    labels of the failures no entry's records take in `.unmatched` (a new bug, or a record narrower than its bug) and
    keeps the smallest such case of each label (the oracle's work) in `.examples`, for a look at what the search met,
    and returns a result, stopping the seed, once every entry has one."""
    from attnfuzz.oracles.verdict import Verdict
    from attnfuzz.strategies.case import Case
    from attnfuzz.strategies.lengths import work
    found, unmatched, examples, sizes = {}, Counter(), {}, {}

    def judge(failure: dict) -> dict | None:
        hits = {name: one(failure) for name, one in judge_of.items()}
        for name, hit in hits.items():
            if hit is not None and name not in found:
                found[name] = hit
        if all(hit is None for hit in hits.values()):
            verdict = Verdict.from_dict(failure["verdict"])
            unmatched[verdict.label] += 1
            try:
                size = work(Case.from_dict(failure["case"]))
            except ValueError:   # an older build's field this one does not have: kept only as a first example
                size = float("inf")
            if verdict.label not in examples or size < sizes[verdict.label]:
                examples[verdict.label], sizes[verdict.label] = {
                    "case": failure["case"], "message": verdict.message, "cases": failure["cases"]}, size
        return {"found": True} if len(found) == len(judge_of) else None
    judge.found, judge.unmatched, judge.examples = found, unmatched, examples
    return judge


def groups(run: dict, together: bool) -> list[list[str]]:
    """The entries each seed process searches for: one each, or (together) all those of one backend, kernel folder
    and ISA."""
    if not together:
        return [[entry] for entry in run]
    keyed: dict[tuple, list[str]] = {}
    for entry, what in run.items():
        keyed.setdefault((what["backend"], what.get("kernel_path"), what.get("isa")), []).append(entry)
    return list(keyed.values())


def gpu_share(device: str, jobs: int) -> int:
    """Bytes of the GPU's memory each of `jobs` seeds at once may hold (nine tenths of it, split evenly)."""
    import torch
    return int(0.9 * torch.cuda.get_device_properties(torch.device(device)).total_memory / jobs)


def fail(message: str) -> None:
    print(f"recall.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("builds", nargs="*", metavar="NAME=DIR", help="A/B: a name and the folder attnfuzz is installed in")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--entries", action="append", default=[], metavar="GLOB",
                   help="entries to run, a glob on the file name (repeatable; default every one that can run)")
    p.add_argument("--corpus", type=Path, default=REPO / "corpus", help="the corpus folder (default corpus/)")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=600.0, help="seconds a seed may search (default 600)")
    p.add_argument("--budget-cases", type=int, help="cases a seed may draw (default: no limit but --budget-s)")
    p.add_argument("--profile", default="quick", help="attnfuzz profile of each run (default quick)")
    p.add_argument("--max-examples", type=int, help="examples per Hypothesis run (default: the profile's)")
    p.add_argument("--case-timeout", type=float, default=60.0, help="seconds an isolated case may take (default 60)")
    p.add_argument("--jobs", type=int, default=1, help="seeds run at once, each in its own process (default 1)")
    p.add_argument("--together", action="store_true",
                   help="one process a seed for all the chosen entries of a backend, each held out (see above)")
    p.add_argument("--replays", type=int, default=3, help="replays of each entry's case before it is searched for: "
                   "an entry none fails is not run (default 3; 0: search for every entry)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    p.add_argument("--compile-time-share", type=float, help="search as a campaign: fresh draws get this share of time")
    args = p.parse_args(argv)
    if args.device.split(":")[0] not in ("cpu", "cuda"):
        fail(f"--device {args.device!r}: use cpu or cuda")
    if not args.corpus.is_dir():
        fail(f"--corpus {args.corpus}: not a folder")
    if min(args.seeds, args.budget_s, args.budget_cases or 1, args.max_examples or 1, args.jobs) <= 0:
        fail("--seeds, --budget-s, --budget-cases, --max-examples and --jobs must be above 0")
    if args.replays < 0:
        fail(f"--replays {args.replays}: give 0 or more")
    if args.compile_time_share is not None and not 0 <= args.compile_time_share < 1:
        fail(f"--compile-time-share {args.compile_time_share}: give a share from 0 up to 1 (0: the fixed share)")
    builds = []
    for spec in args.builds:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not Path(folder, "attnfuzz").is_dir():
            fail(f"{spec!r}: give NAME=DIR, DIR holding an installed attnfuzz (DIR/attnfuzz)")
        builds.append((name, Path(folder).resolve()))
    builds = builds or [("here", None)]
    chosen = child(builds[0][1], "plan", str(args.corpus.resolve()), args.device, args.entries, args.profile)
    if "error" in chosen:
        fail(chosen["error"])
    if args.replays:
        leave_out_unreproduced(chosen, groups(chosen["run"], True), builds[0][1], str(args.corpus.resolve()),
                               args)
    if builds[0][1] is not None:
        sys.path.insert(0, str(builds[0][1]))   # the first build judges every build's failures
    judge = judges(str(args.corpus.resolve()), chosen["run"])
    runs = {name: {entry: [] for entry in chosen["run"]} for name, _ in builds}
    tasks, turn = [], 0
    for group in groups(chosen["run"], args.together):
        for seed in range(1, args.seeds + 1):
            tasks += [(group, seed, builds[(i + turn) % len(builds)]) for i in range(len(builds))]
            turn += 1
    if args.jobs > 1 and args.device.startswith("cuda"):
        os.environ.setdefault("ATTNFUZZ_GPU_MEMORY_SHARE", str(gpu_share(args.device, args.jobs)))

    def one(task):
        group, seed, (name, site) = task
        what = chosen["run"][group[0]]
        held_out = sorted({n for entry in group for n in chosen["run"][entry]["held_out"]})
        seen = gather({entry: judge[entry] for entry in group})
        end = child(site, "search", str(args.corpus.resolve()), what["backend"], what.get("kernel_path"), held_out,
                    args.device, args.profile, args.max_examples, seed, args.budget_s, args.budget_cases,
                    args.case_timeout, time.time(), args.compile_time_share, timeout=args.budget_s + GRACE_S,
                    isa=what.get("isa"), judge=seen)
        searched = {k: v for k, v in end.items() if k in ("error", "rounds", "cases_run", "statuses", "unrun")}
        rows = []
        for entry in group:
            row = seen.found.get(entry) or {"found": False, **searched}
            if seen.unmatched:
                row = {**row, "unmatched": dict(seen.unmatched), "unmatched_examples": dict(seen.examples)}
            print(f"  {name} {entry} seed {seed}: " + (f"found at case {row['cases']}, {row['seconds']} s"
                  if row.get("found") else row.get("error", "not found")), file=sys.stderr, flush=True)
            rows.append((name, entry, {"seed": seed, **row}))
        return rows

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:   # each task waits on a process of its own
        for rows in pool.map(one, tasks):
            for name, entry, row in rows:
                runs[name][entry].append(row)
    summaries = {name: summarize(r, args.seeds) for name, r in runs.items()}
    if args.json:
        print(json.dumps({"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                          "held_out": {e: w["held_out"] for e, w in chosen["run"].items()},
                          "isa": {e: w["isa"] for e, w in chosen["run"].items() if w.get("isa")},
                          "builds": summaries, "not_run": chosen["not_run"], "processes": len(tasks)}, indent=2))
        return 0
    print(show_all(summaries, chosen, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
