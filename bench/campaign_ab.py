"""The rate and breadth of two attnfuzz builds' campaigns, measured in turns on the same machine.

    python3 bench/campaign_ab.py A=DIR B=DIR --backends sdpa-math,sdpa-flash [--seconds 90] [--rounds 2]
                                 [--device cuda] [--workers N] [--side-by-side] [--keep OUT]
                                 [--options 'B=--compile-time-share 0'] [--cold]

Each DIR holds an installed attnfuzz (`pip install --no-deps --no-build-isolation --target DIR CHECKOUT`). Each round
runs one `attnfuzz campaign` per build, every one in a fresh directory for `--seconds` of lane time (the
campaign's `--hours`; its warm-ups and report come on top), with an empty findings folder, so only the shipped
corpus is known. The builds take turns, starting from a rotating position; `--side-by-side` runs them at once
instead (on a CPU: one per core, the load falls on both alike). Per build and round it prints, per backend, the
graded cases (logged, run and not refused) per second of lane time, the distinct (sq, skv) shapes, the share of the most
drawn shape, and the files in the campaign's example database; then each build's summed rate against the first's.
`--options NAME=ARGS` gives one build's campaigns more arguments, so one DIR under two names compares two settings of
one build. `--cold` gives each campaign compile caches of its own (FA4's, FlashInfer's, inductor's, Triton's), empty:
without it a later campaign loads the kernels an earlier one compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path


COMPILE_CACHES = ("TORCHINDUCTOR_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "TRITON_CACHE_DIR",
                  "FLASHINFER_WORKSPACE_BASE")


def campaign(site: Path, directory: Path, args, extra: list[str]) -> subprocess.Popen:
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))  # a GPU stack may be on it
    env = {**os.environ, "PYTHONPATH": path, "PYTHONNOUSERSITE": "1",
           "ATTNFUZZ_CORPUS": str(directory / "findings")}
    if args.cold:
        env.update({name: str(directory / "cache" / name.lower()) for name in COMPILE_CACHES})
    command = [sys.executable, "-m", "attnfuzz", "campaign", "--dir", str(directory / "camp"), "--backends",
               args.backends, "--device", args.device, "--hours", str(args.seconds / 3600)]
    if args.workers:
        command += ["--workers", str(args.workers)]
    command += extra
    return subprocess.Popen(command, env=env, cwd=site, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def measured(directory: Path, seconds: float) -> dict:
    """Per backend: graded cases per second, distinct shapes, the most drawn shape's share; and the database's files."""
    rows = []
    for log in sorted((directory / "camp" / "cases").glob("lane*.jsonl")):
        rows += [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]
    graded, shapes = Counter(), defaultdict(Counter)
    for row in rows:
        # graded: run and not refused; a case the known-crash skip answered is logged "not run: ..." and was not run
        if row["label"] != "UNSUPPORTED" and not row.get("message", "").startswith("not run:"):
            graded[row["backend"]] += 1
            shapes[row["backend"]][row["case"]["sq"], row["case"]["skv"]] += 1
    out = {name: {"rate": graded[name] / seconds, "shapes": len(shapes[name]),
                  "top": shapes[name].most_common(1)[0][1] / graded[name]} for name in graded}
    db = directory / "camp" / "db"
    out["db_files"] = sum(len(files) for _, _, files in os.walk(db)) if db.exists() else 0
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("builds", nargs="+", help="NAME=DIR of an installed attnfuzz, two or more")
    p.add_argument("--backends", required=True)
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int)
    p.add_argument("--side-by-side", action="store_true")
    p.add_argument("--keep", type=Path, help="keep every campaign directory under this folder")
    p.add_argument("--options", action="append", default=[], metavar="NAME=ARGS",
                   help="more campaign arguments for one build, e.g. 'fixed=--compile-time-share 0'")
    p.add_argument("--cold", action="store_true", help="empty compile caches of its own for each campaign")
    args = p.parse_args()
    builds = [(b.split("=", 1)[0], Path(b.split("=", 1)[1]).resolve()) for b in args.builds if "=" in b]
    if len(builds) < 2 or len(builds) != len(args.builds) or len({name for name, _ in builds}) != len(builds):
        p.error("give two or more builds as NAME=DIR, each NAME once")
    extra = {name: [] for name, _ in builds}
    for option in args.options:
        name, _, text = option.partition("=")
        if name not in extra:
            p.error(f"--options {option!r}: {name!r} is not one of the builds ({', '.join(extra)})")
        extra[name] += shlex.split(text)
    root = args.keep or Path(tempfile.mkdtemp(prefix="campaign-ab-"))
    totals = defaultdict(float)
    for r in range(args.rounds):
        order = builds[r % len(builds):] + builds[:r % len(builds)]
        waves = [order] if args.side_by_side else [[b] for b in order]
        for wave in waves:
            started = {name: campaign(site, root / f"{name}-{r}", args, extra[name]) for name, site in wave}
            for name, proc in started.items():
                err = proc.communicate()[1]
                if proc.returncode not in (0, 1):
                    sys.exit(f"{name}: campaign exited with {proc.returncode}:\n{err[-2000:]}")
        for name, _ in order:
            result = measured(root / f"{name}-{r}", args.seconds)
            db = result.pop("db_files")
            for backend, m in sorted(result.items()):
                totals[name] += m["rate"]
                print(f"round {r} {name:>8} {backend:<24} {m['rate']:8.1f} graded/s  {m['shapes']:6d} shapes  "
                      f"top {100 * m['top']:4.1f} %")
            print(f"round {r} {name:>8} example database: {db} files", flush=True)
    first = builds[0][0]
    for name, _ in builds:
        print(f"{name}: {totals[name] / args.rounds:.1f} graded/s summed over backends, "
              f"{totals[name] / totals[first]:.3f}x {first}")
    print(f"campaigns in {root}" if args.keep else "")


if __name__ == "__main__":
    main()
