"""Graded cases per second through the whole fuzz loop (Hypothesis draw, materialize, backend, oracle, grade).

    python3 bench/throughput.py [--backend sdpa-math] [--examples 500] [--device cpu] [--lanes 1]
                                [--space small|default|short|compare|storage] [--batch-check] [--rounds 2]
                                [--repeats N]

--space small (the default): small shapes (b <= 2, s <= 64, h <= 4, d <= 64). default: the device's default Space
(Space.for_device, what `attnfuzz run` draws: one case in 10 of a long shape, head dims to 512); short:
that Space held to the lengths and head dims drawn before long shapes (max_len 160, d <= 128); compare: short and
default alternating in one process, `--rounds` times each, and the ratio of their summed small-case rates (with
`--long-one-in N`, the default space draws one long case in N instead); storage: the small space without per-tensor
storage (storages=("plain",)) and with it (the default), alternating `--rounds` times in one process, and the ratio
of their summed small-case rates (what drawing and laying out the buffers costs). Besides the totals, each run reports its small-case rate
(graded cases with sq, skv <= 160 per second of the whole run: what long cases cost the everyday ones) and the share
of the time spent on long cases (a case's time: from the previous case's verdict to its own).

It splits one process's time: backend (until its results are ready: the GPU is synchronized before the clock
stops), oracle + grade (float64 references, bounds, diagnosis), inputs (drawing and moving the tensors) and the
fuzzer (Hypothesis, bookkeeping). `--lanes N` runs N such processes at once on the same device, each with its own
Hypothesis stream, as `attnfuzz campaign --workers N` would, started together after their warm-up; the aggregate is
their graded cases over the common wall time.

--batch-check: the cost of the batch-invariance check (fuzz/engine/batch.py) as a ratio in one process: the same
cases (the same seed) measured with the check turned off and on, alternately (off on, on off, ... after one run
uncounted), `--rounds` times each; it prints the
rate of each and on / off over the summed times (wall time, and the process's CPU time, which other load on the
machine moves less), how many cases the check ran on, and the share of the time the check itself took within the
runs with it (timed around it, case by case, under the same load as the rest: the steadiest of the three figures on
a shared machine).

For sdpa-math (and sdpa-flash on CUDA) it then runs bench/bare_loop.py (a hand-written Hypothesis test of the same
kernel against a float64 reference, no attnfuzz) in the same process for as many examples, and prints attnfuzz's rate as a ratio of the bare
loop's: the fuzzer's overhead, measured under the same load; `--repeats N` alternates the two N times and prints the
median of the N ratios, by wall time and by the process's CPU time (on a shared machine a single wall-time ratio
moves by tens of percent; the CPU-time ratio much less).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnfuzz.strategies.lengths import SMALL_LEN
from attnfuzz.strategies.space import Space

SMALL = Space(max_batch=2, max_len=64, max_heads=4, max_head_dim=64)


def space_named(name: str, device: str, long_one_in: int | None = None) -> Space:
    default = Space.for_device(device)
    space = {"small": SMALL, "default": default.replace(long_one_in=long_one_in or default.long_one_in),
             "short": Space.for_device(device).replace(max_len=SMALL_LEN, max_head_dim=128)}[name]
    # on a GPU, plain buffers only: torch's flash and efficient SDPA kernels fault on a tensor one element into its
    # buffer (corpus/sdpa-flash-CRASH-EXIT_1-fac5df0cfa14), which loses the CUDA context of the measured process
    return space if torch_device_is_cpu(device) else space.replace(storages=("plain",))


def torch_device_is_cpu(device: str) -> bool:
    return str(device).split(":")[0] == "cpu"


def measure(backend_name: str, device: str, examples: int, go: Path | None = None, space: Space = SMALL,
            space_name: str = "small", seed: int | None = 0) -> dict:
    """One process's run: warm up, (wait for `go` to exist,) fuzz `examples` cases, and split the time."""
    import torch

    import attnfuzz.engine.harness as harness_module
    from attnfuzz.backends import get
    from attnfuzz.store.corpus import known_bugs
    from attnfuzz.engine.harness import fuzz
    from attnfuzz.engine.profiles import profile
    from attnfuzz.oracles import grade as grade_module

    backend = get(backend_name, device)
    # paid once per process, on the first case spelled with torch's causal-bias masks: importing them imports
    # torch._dynamo (about 1 s on a 2-core CPU), which would otherwise land in whichever measured run meets one first
    import torch.nn.attention.bias  # noqa: F401
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    spent = {"backend": 0.0, "oracle": 0.0, "inputs": 0.0, "batch": 0.0}

    def timed(fn, key):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sync()
                spent[key] += time.perf_counter() - start
        return wrapper

    backend.run = timed(backend.run, "backend")
    grade_module.Oracle.of = harness_module.Oracle.of = timed(grade_module.Oracle.of, "oracle")
    harness_module.grade = timed(harness_module.grade, "oracle")
    drawing = "draw" if hasattr(harness_module, "draw") else "draw_on_cpu"  # (the name in older trees, to compare)
    setattr(harness_module, drawing, timed(getattr(harness_module, drawing), "inputs"))
    harness_module.Tensors.to = timed(harness_module.Tensors.to, "inputs")
    checked_verdict = harness_module.batch.checked_verdict
    harness_module.batch.checked_verdict = timed(checked_verdict, "batch")  # its backend runs count as backend too
    harness_module.with_storage = timed(harness_module.with_storage, "inputs")
    known = known_bugs(Path("corpus"))
    fuzz(backend, device=device, space=space_named("small", device), known=known,
         settings=profile("ci", max_examples=20))  # warm-up
    per_case = {"small": 0, "small_s": 0.0, "long": 0, "long_s": 0.0, "storage_cases": 0}
    last = [0.0]

    def on_case(case, verdict, tally):
        now = time.perf_counter()
        kind = "long" if max(case.sq, case.skv) > SMALL_LEN else "small"
        per_case[kind] += verdict.status != "UNSUPPORTED"
        per_case["storage_cases"] += case.storage != ("plain",) * 3
        per_case[f"{kind}_s"] += now - last[0]
        last[0] = now

    spent.update(backend=0.0, oracle=0.0, inputs=0.0, batch=0.0)
    if go is not None:
        Path(f"{go}.ready.{id(spent)}").touch()
        while not go.exists():
            time.sleep(0.01)
    began, cpu = time.time(), time.process_time()
    last[0] = time.perf_counter()
    tally, findings = fuzz(backend, device=device, space=space, known=known, on_case=on_case,
                           settings=profile("ci", max_examples=examples, derandomize=False), seed=seed)
    harness_module.batch.checked_verdict = checked_verdict
    cpu = time.process_time() - cpu
    graded = sum(v for k, v in tally.labels.items() if not k.startswith("UNSUPPORTED"))
    return {"backend": backend_name, "examples": tally.examples, "graded": graded, "seconds": tally.seconds,
            "cpu_seconds": cpu, "batch_checked": tally.batch_checked, "batch_invariant": tally.batch_invariant,
            "began": began, "ended": time.time(), "labels": dict(tally.labels), "space": space_name, **per_case,
            **{f"{k}_s": v for k, v in spent.items()},
            "findings": [f"{f.verdict.label}: {f.verdict.message}\n    {f.case!r}" for f in findings]}


def describe(r: dict) -> str:
    work = r["backend_s"] + r["oracle_s"]
    other = r["seconds"] - work - r["inputs_s"]
    timed = max(r["small_s"] + r["long_s"], 1e-9)
    return (f"{r['backend']} on the {r['space']} space: {r['small'] / r['seconds']:.1f} small graded cases/s; "
            f"{r['long']} long cases took {100 * r['long_s'] / timed:.1f}% of the time\n  "
            f"{r['examples']} examples ({r['graded']} graded) in {r['seconds']:.2f}s = "
            f"{r['graded'] / r['seconds']:.1f} graded cases/s; labels {r['labels']}\n"
            f"  per case: backend {1e3 * r['backend_s'] / r['examples']:.2f} ms, oracle+grade "
            f"{1e3 * r['oracle_s'] / r['examples']:.2f} ms, inputs {1e3 * r['inputs_s'] / r['examples']:.2f} ms, "
            f"fuzzer and the rest {1e3 * other / r['examples']:.2f} ms; ratio fuzzer total / (backend + oracle) = "
            f"{r['seconds'] / max(work, 1e-9):.2f}; findings {len(r['findings'])}"
            + "".join(f"\n  {f}" for f in r["findings"]))


def summed_rates(runs: dict[str, list[dict]], count: str, seconds: str = "seconds") -> dict[str, float]:
    """Per mode, the runs' summed `count` over their summed `seconds` (wall, or "cpu_seconds")."""
    return {mode: sum(r[count] for r in rs) / sum(r[seconds] for r in rs) for mode, rs in runs.items()}


def batch_cost(args) -> None:
    """The same cases with the batch check off and on, alternately: the rate of each and their ratio."""
    from attnfuzz.engine import batch
    checked = batch.checked
    runs = {"off": [], "on": []}
    measure(args.backend, args.device, args.examples, space=space_named(args.space, args.device), seed=args.seed)
    for round_ in range(args.rounds):  # after a run of the same cases uncounted, in the order ABBA: drift cancels
        for mode in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
            batch.checked = checked if mode == "on" else (lambda case: False)
            try:
                runs[mode].append(measure(args.backend, args.device, args.examples,
                                          space=space_named(args.space, args.device), space_name=args.space,
                                          seed=args.seed))
            finally:
                batch.checked = checked
    rate, cpu = summed_rates(runs, "graded"), summed_rates(runs, "graded", "cpu_seconds")
    on = runs["on"][-1]
    share = sum(r["batch_s"] for r in runs["on"]) / sum(r["seconds"] for r in runs["on"])
    print(f"{args.backend} on the {args.space} space, {args.examples} examples x {args.rounds} rounds each: "
          f"{rate['off']:.1f} graded cases/s without the batch check, {rate['on']:.1f} with it; on / off = "
          f"{rate['on'] / rate['off']:.3f} (per CPU second of the process, robust to other load: "
          f"{cpu['off']:.1f} and {cpu['on']:.1f}, on / off = {cpu['on'] / cpu['off']:.3f}); checked {on['batch_checked']} of {on['examples']} cases per run, "
          f"{on['batch_invariant']} of them batch invariant; within the runs with it, the check took {100 * share:.1f}% "
          f"of the time: a rate of {1 - share:.3f} x the same run without it")


def lanes(args) -> None:
    """`args.lanes` processes of `measure`, released together; their aggregate rate."""
    with tempfile.TemporaryDirectory() as tmp:
        go = Path(tmp) / "go"
        cmd = [sys.executable, __file__, "--backend", args.backend, "--device", args.device, "--examples",
               str(args.examples), "--json", "--go", str(go), "--space", args.space]
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(args.lanes)]
        while len(list(Path(tmp).glob("go.ready.*"))) < args.lanes and all(p.poll() is None for p in procs):
            time.sleep(0.05)
        go.touch()
        results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    for r in results:
        print(describe(r))
    wall = max(r["ended"] for r in results) - min(r["began"] for r in results)
    graded = sum(r["graded"] for r in results)
    print(f"{args.backend} on {args.device}, {args.lanes} lanes: {graded} graded cases in {wall:.2f}s of wall time = "
          f"{graded / wall:.1f} graded cases/s in aggregate")


BARE_KERNEL = {"sdpa-math": "math", "sdpa-flash": "flash"}   # the backends bench/bare_loop.py has a twin of


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="sdpa-math")
    p.add_argument("--examples", type=int, default=500)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads, as the CLI's --threads")
    p.add_argument("--lanes", type=int, default=1, help="processes fuzzing the backend at once")
    p.add_argument("--seed", type=int, default=0, help="Hypothesis seed of the measured run (the same cases each time)")
    p.add_argument("--space", default="small", choices=("small", "default", "short", "compare", "storage"))
    p.add_argument("--batch-check", action="store_true",
                   help="measure the batch-invariance check's cost: the same cases with it off and on")
    p.add_argument("--rounds", type=int, default=2,
                   help="with --batch-check or --space storage / compare: measured runs of each, alternating")
    p.add_argument("--repeats", type=int, default=1,
                   help="sdpa-math, sdpa-flash: alternate the fuzz loop and the bare loop this many times; the median ratio")
    p.add_argument("--long-one-in", type=int, help="the default space's share of long cases, one in N (Space.long_one_in)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--go", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.lanes > 1:
        return lanes(args)
    import torch
    torch.set_num_threads(args.threads)
    if args.batch_check:
        return batch_cost(args)
    if args.space == "compare":
        runs = {"short": [], "default": []}
        for round_ in range(args.rounds):  # ABBA, so drift on a shared machine hits both alike
            for name in ("short", "default") if round_ % 2 == 0 else ("default", "short"):
                runs[name].append(measure(args.backend, args.device, args.examples,
                                          space=space_named(name, args.device, args.long_one_in), space_name=name,
                                          seed=args.seed + round_))   # a seed a round: other mixes of cases
                print(describe(runs[name][-1]))
        rate, cpu = summed_rates(runs, "small"), summed_rates(runs, "small", "cpu_seconds")
        long_share = sum(r["long_s"] for r in runs["default"]) / sum(r["small_s"] + r["long_s"] for r in runs["default"])
        print(f"small-case rate, default / short space, over {args.rounds} runs of each: "
              f"{rate['default'] / rate['short']:.2f} (by CPU time {cpu['default'] / cpu['short']:.2f}); long cases "
              f"took {100 * long_share:.1f}% of the default space's time")
        return
    if args.space == "storage":
        runs: dict[str, list[dict]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            for name, space in (("off", SMALL.replace(storages=("plain",))), ("on", SMALL)):
                runs[name].append(measure(args.backend, args.device, args.examples, space=space,
                                          space_name=f"small, storage {name}", seed=args.seed))
                print(describe(runs[name][-1]))
        rate = summed_rates(runs, "small")
        drawn = sum(r["storage_cases"] for r in runs["on"])
        print(f"small-case rate with storage / without: {rate['on']:.1f} / {rate['off']:.1f} = "
              f"{rate['on'] / rate['off']:.3f} ({drawn} cases with a storage other than plain)")
        return
    bare = not args.json and BARE_KERNEL.get(args.backend)
    if bare:
        sys.path.insert(0, str(Path(__file__).parent))
        import bare_loop
        bare_loop.run(20, device=args.device, kernel=bare)  # warm-up
    ratios = []
    for _ in range(args.repeats if bare else 1):  # interleaved with the bare loop, so machine load hits both alike
        result = measure(args.backend, args.device, args.examples, args.go, space_named(args.space, args.device),
                         args.space, args.seed)
        print(json.dumps(result) if args.json else describe(result))
        if bare:
            cpu = time.process_time()
            n, seconds = bare_loop.run(args.examples, args.seed, args.device, bare)
            cpu = time.process_time() - cpu
            ours = result["examples"] / result["seconds"]
            ratios.append((ours / (n / seconds), (result["examples"] / result["cpu_seconds"]) / (n / cpu)))
            print(f"bare loop (bench/bare_loop.py): {n} cases in {seconds:.2f}s = {n / seconds:.1f} cases/s; attnfuzz "
                  f"{ours:.1f} examples/s = {ratios[-1][0]:.2f}x the bare loop ({ratios[-1][1]:.2f}x by CPU time)")
    if len(ratios) > 1:
        wall, cpu = zip(*ratios)
        print(f"attnfuzz / bare loop over {len(ratios)} interleaved runs: median {statistics.median(wall):.2f}x "
              f"(runs: {', '.join(f'{r:.2f}' for r in wall)}); by CPU time {statistics.median(cpu):.2f}x "
              f"(runs: {', '.join(f'{r:.2f}' for r in cpu)})")

if __name__ == "__main__":
    main()
