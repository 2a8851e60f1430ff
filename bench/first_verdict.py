"""Time to first verdict from a cold start: a fresh `attnfuzz run` process per backend (imports, CUDA start-up,
JIT compilation with an empty FA4 cache), timed until its first case is logged, and until its first graded case
(a backend's first drawn cases may be ones it refuses: UNSUPPORTED is a verdict, not a grade).

    python3 bench/first_verdict.py --device cuda sdpa-math sdpa-flash fa4 te-fused flex-compiled

--until saved: time to the first finding instead (a FAIL, CRASH or HANG verdict logged: the case's number and the
seconds), and to its corpus entry saved (found, shrunk and written), for the run as a user starts it (`--isolate`),
knowing the known bugs of no corpus, or those of a copy of `--corpus-from` less the entries named by `--drop` (globs;
the copy stands in for the shipped corpus through $ATTNFUZZ_SHIPPED_CORPUS); `--keep DIR` keeps each run's case log
(every case's label and seconds: a timeline of the search and the shrink), its stderr and the entries it saved:

    python3 bench/first_verdict.py --device cuda --until saved te-flash
    python3 bench/first_verdict.py --device cuda --until saved --first-bug --seed 0 te-flash
    python3 bench/first_verdict.py --device cuda --until saved --corpus-from corpus --drop 'fa4-FAIL-ALL_ZERO-*' fa4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def first_verdict(backend: str, device: str, timeout: float) -> tuple[float | None, str, float | None]:
    """Seconds from spawning the process to its first logged verdict, that verdict's label, and seconds to the
    first graded verdict (None if none came within the timeout)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cases.jsonl"
        env = {**os.environ, "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(Path(tmp) / "fa4-cache")}
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "attnfuzz", "run", "--backend", backend, "--device", device,
                                 "--profile", "ci", "--max-examples", "200", "--corpus", str(Path(tmp) / "corpus"),
                                 "--log", str(log)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        first, label = None, f"no verdict in {timeout:.0f}s"
        try:
            while time.perf_counter() - start < timeout:
                lines = log.read_text().splitlines() if log.exists() else []
                labels = [json.loads(line)["label"] for line in lines if line.endswith("}")]
                if labels and first is None:
                    first, label = time.perf_counter() - start, labels[0]
                if any(not x.startswith("UNSUPPORTED") for x in labels):
                    return first, label, time.perf_counter() - start
                if proc.poll() is not None:
                    return first, label if first else f"exited {proc.returncode}: {proc.stderr.read()[-300:]}", None
                time.sleep(0.02)
            return first, label, None
        finally:
            proc.kill()
            proc.wait()


def entries(corpus: Path) -> set[str]:
    return {p.name for p in corpus.glob("*.json") if not p.name.startswith(".")}


def first_finding(backend: str, device: str, timeout: float, corpus_from: Path | None, drop: list[str],
                  keep: Path | None = None, options: tuple[str, ...] = ()) -> str:
    """One line: when the first finding was logged (case number, seconds from spawning the process), when its corpus
    entry was saved, the graded cases per second of the run until then, and the cases run after the finding (its
    shrink and confirmation) with their mean seconds. `keep`: a folder that receives the run's case log and stderr
    (<backend>.jsonl, <backend>.err) for a case-by-case timeline, and the entries it saved (<backend>-findings/).
    `options`: more options of `attnfuzz run`."""
    with tempfile.TemporaryDirectory() as tmp:
        log, known, corpus = Path(tmp) / "cases.jsonl", Path(tmp) / "known", Path(tmp) / "findings"
        known.mkdir()
        if corpus_from is not None:
            for entry in corpus_from.glob("*.json"):
                if not any(entry.match(pattern) or entry.stem == pattern for pattern in drop):
                    shutil.copy(entry, known)
        # run from an empty folder with a data folder of its own, as a new user does: a failure an earlier run saved
        # in Hypothesis's example database ($XDG_DATA_HOME/attnfuzz/examples) would be replayed first (found and
        # saved at case 1); modules named package.module:function still import from this folder
        cwd = Path(tmp) / "cwd"
        cwd.mkdir()
        env = {**os.environ, "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(Path(tmp) / "fa4-cache"),
               "XDG_DATA_HOME": str(Path(tmp) / "data"),
               "ATTNFUZZ_SHIPPED_CORPUS": str(known),
               "PYTHONPATH": os.pathsep.join(filter(None, (os.getcwd(), os.environ.get("PYTHONPATH"))))}
        start = time.perf_counter()
        stderr = (Path(tmp) / "stderr").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "attnfuzz", "run", "--backend", backend, "--device", device,
                                 "--isolate", "--corpus", str(corpus), "--log", str(log), *options], env=env, cwd=cwd,
                                stdout=subprocess.DEVNULL, stderr=stderr)
        found = saved = None

        def look() -> None:
            nonlocal found, saved
            rows = [json.loads(line) for line in (log.read_text().splitlines() if log.exists() else [])
                    if line.endswith("}")]
            hits = [i for i, row in enumerate(rows) if row["label"].startswith(("FAIL", "CRASH", "HANG"))]
            if hits and found is None:
                found = (hits[0] + 1, rows[hits[0]]["label"], time.perf_counter() - start)
            if saved is None and corpus.exists() and entries(corpus):   # dot files are the in-flight record, not entries
                saved = time.perf_counter() - start

        try:
            while time.perf_counter() - start < timeout and saved is None and proc.poll() is None:
                look()
                time.sleep(0.05)
            look()
        finally:
            proc.kill()
            proc.wait()
            stderr.close()
        wall = time.perf_counter() - start
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            name = backend.replace(":", "-").replace("/", "-")
            for source, suffix in ((log, "jsonl"), (Path(tmp) / "stderr", "err")):
                if source.exists():
                    shutil.copy(source, keep / f"{name}.{suffix}")
            if corpus.exists():  # the entries saved (a repro script may be missing: the run stops at the first JSON)
                shutil.copytree(corpus, keep / f"{name}-findings", dirs_exist_ok=True)
        rows = [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")] if log.exists() else []
        graded = sum(not row["label"].startswith(("UNSUPPORTED", "CRASH", "HANG")) for row in rows)
        shown_found = (f"case {found[0]} ({found[1]}) at {found[2]:.1f}s" if found else f"none in {wall:.0f}s")
        shown_saved = f"{saved:.1f}s" if saved is not None else f"not within {wall:.0f}s"
        after = rows[found[0]:] if found else []
        shown_after = (f"; after the finding {len(after)} cases, {sum(r['seconds'] for r in after) / len(after):.2f}s "
                       f"each on average" if after else "")
        return (f"{backend}: first finding {shown_found}; saved at {shown_saved}; {len(rows)} cases logged, "
                f"{graded} graded = {graded / wall:.2f} graded cases/s over the run{shown_after}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("backends", nargs="+")
    p.add_argument("--device", default="cpu")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--until", choices=("verdict", "saved"), default="verdict")
    p.add_argument("--corpus-from", type=Path, help="--until saved: start from a copy of this corpus")
    p.add_argument("--drop", action="append", default=[], help="--until saved: leave these entries out of the copy")
    p.add_argument("--keep", type=Path,
                   help="--until saved: a folder for each run's case log, stderr and saved entries")
    p.add_argument("--first-bug", action="store_true", help="--until saved: run with --first-bug")
    p.add_argument("--seed", type=int, help="--until saved: run with this Hypothesis seed (two builds then draw the "
                                            "same cases up to their first difference)")
    args = p.parse_args()
    for backend in args.backends:
        if args.until == "saved":
            options = ("--first-bug",) * args.first_bug + (("--seed", str(args.seed)) if args.seed is not None else ())
            print(first_finding(backend, args.device, args.timeout, args.corpus_from, args.drop, args.keep, options),
                  flush=True)
            continue
        seconds, label, graded = first_verdict(backend, args.device, args.timeout)
        shown = f"{seconds:.1f}s" if seconds is not None else "-"
        shown_graded = f"{graded:.1f}s" if graded is not None else "none in the timeout"
        print(f"{backend}: first verdict after {shown} ({label}), first graded after {shown_graded}", flush=True)


if __name__ == "__main__":
    main()
