"""What a case costs, by part: the fuzzer's draw, the backend's refusal check, the inputs, the kernel's build (its
first call less its second: a JIT compile, a cuDNN graph, a lazy import), the kernel, the float64 oracle, the grade,
and the isolation worker's round trip. And, with --rate, graded cases per second of the search itself, in a fresh
process per round, for each compiled share given (0: every case drawn fresh).

    python3 bench/case_cost.py --backend sdpa-cudnn --device cuda --cases 200
    python3 bench/case_cost.py --backend sdpa-cudnn --device cuda --rate --shares 0,0.8 --examples 200 --rounds 2

Parts: the cases are drawn first as the search draws them (cases_for, the default Space of the device, or --space
small), timed together (draw = that time / the cases); each is then run as the harness runs it (engine/harness.py's
_graded, less the bitwise and batch reruns), each part timed with the device synchronised. `ipc` runs --ipc-cases of
them through an isolated worker twice and in this process twice, and is the difference of the second runs. The rate
mode runs the search (`fuzz`, shipped corpus known, no shrinking cut short) and prints graded cases per second and
the distinct compile keys met; rounds alternate the shares, so a drift of the machine hits both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

PARTS = ("draw", "refuse", "inputs", "build", "kernel", "oracle", "grade", "ipc")


def _sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _drawn(backend, space, n: int, seed: int) -> tuple[list, float]:
    from hypothesis import HealthCheck, Phase, given, settings, seed as hseed
    from attnfuzz.engine.harness import cases_for
    cases: list = []

    @hseed(seed)
    @settings(max_examples=n, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases_for(backend, space))
    def collect(case):
        cases.append(case)

    start = time.perf_counter()
    collect()
    return cases, (time.perf_counter() - start) / max(len(cases), 1)


def _timed(fn, device: str):
    start = time.perf_counter()
    value = fn()
    _sync(device)
    return value, time.perf_counter() - start


def parts(backend, device: str, space, n: int, seed: int, ipc_cases: int) -> dict:
    from attnfuzz.engine.harness import oracle_inputs, run_case
    from attnfuzz.engine.isolate import Worker
    from attnfuzz.oracles.grade import Oracle, grade
    from attnfuzz.strategies.materialize import draw, draw_device, with_storage
    from attnfuzz.engine.cuda_errors import may_break_context
    cases, draw_s = _drawn(backend, space, n, seed)
    rows, refused, crashed, broken = [], 0, 0, ""
    for case in cases:
        reason, refuse_s = _timed(lambda: backend.unsupported(case), "cpu")
        if reason is not None:
            refused += 1
            rows.append({"refuse": refuse_s, "draw": draw_s})
            continue
        try:
            (drawn, tensors), inputs_s = _timed(lambda: _inputs(case, device, draw, draw_device, with_storage),
                                                device)
            output, first_s = _timed(lambda: backend.run(case, tensors), device)
            _, kernel_s = _timed(lambda: backend.run(case, tensors), device)
        except Exception as e:  # refused at call time or crashed: not a graded case
            crashed += 1
            if may_break_context(f"{type(e).__name__}: {e}"):  # the process's CUDA context is gone: what was measured stands
                broken = f"stopped after a CUDA error: {str(e)[:120]}"
                break
            continue
        o_tensors, o_device = oracle_inputs(case, drawn, tensors, device)
        oracle, oracle_s = _timed(lambda: Oracle.of(case, o_tensors, device=o_device, family=backend.family), device)
        _, grade_s = _timed(lambda: grade(case, o_tensors, output, family=backend.family, oracle=oracle), device)
        rows.append({"draw": draw_s, "refuse": refuse_s, "inputs": inputs_s, "build": max(first_s - kernel_s, 0.0),
                     "kernel": kernel_s, "oracle": oracle_s, "grade": grade_s})
    graded = [r for r in rows if "kernel" in r]
    ipc = []   # the worker's round trip on a sample: each case's second run isolated less its second run here
    if graded and ipc_cases and not broken:
        with Worker(backend.name, device) as worker:
            for case in [c for c in cases if backend.unsupported(c) is None][:ipc_cases]:
                worker.run(case)
                _, isolated = _timed(lambda: worker.run(case), "cpu")
                run_case(backend, case, device=device)
                _, inline = _timed(lambda: run_case(backend, case, device=device), device)
                ipc.append(max(isolated - inline, 0.0))
    return {"backend": backend.name, "device": device, "cases": len(cases), "refused": refused, "crashed": crashed,
            "graded": len(graded), "rows": rows, "ipc": ipc, "broken": broken}


def _inputs(case, device, draw, draw_device, with_storage):
    drawn = draw(case, draw_device(case, device))
    return drawn, with_storage(case, drawn.to(device))


def table(result: dict) -> str:
    samples = {p: [r[p] for r in result["rows"] if p in r] for p in PARTS}
    samples["ipc"] = result["ipc"]
    total = {p: sum(v) for p, v in samples.items()}   # each part's seconds over the run (ipc: the sampled cases')
    whole = sum(total.values()) or 1.0
    lines = [f"{result['backend']} on {result['device']}: {result['cases']} cases drawn, {result['graded']} graded, "
             f"{result['refused']} refused, {result['crashed']} refused at call time or crashed {result['broken']}",
             f"{'part':<8} {'median ms':>10} {'p90 ms':>9} {'share':>6}"]
    for p in PARTS:
        values = sorted(v * 1e3 for v in samples[p])
        if values:
            p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
            lines.append(f"{p:<8} {statistics.median(values):>10.2f} {p90:>9.2f} {total[p] / whole:>6.1%}")
    lines.append(f"a graded case costs {whole / max(result['graded'], 1) * 1e3:.1f} ms in all, refusals included "
                 f"(ipc: {len(result['ipc'])} sampled cases only)")
    return "\n".join(lines)


def rate_once(name: str, device: str, share: float, examples: int, seed: int, small: bool) -> dict:
    """One search in this process: graded cases per second and compile keys met."""
    from attnfuzz.backends import get
    from attnfuzz.engine.harness import fuzz
    from attnfuzz.engine.isolate import Worker
    from attnfuzz.engine.profiles import profile
    from attnfuzz.oracles import verdict as V
    from attnfuzz.store import corpus as corpus_io
    backend = get(name, device)
    space = _space(device, small).replace(compiled_share=share)
    graded, keys = [], set()

    def on_case(case, verdict, tally):
        if verdict.status != V.UNSUPPORTED:
            graded.append(case)
            keys.add(backend.compile_key(case))

    start = time.perf_counter()
    with Worker(name, device) as worker:   # as `attnfuzz run --isolate`: a kernel's CUDA fault costs one case
        tally, findings = fuzz(backend, device=device, space=space, seed=seed, on_case=on_case, worker=worker,
                               known=corpus_io.known_bugs(corpus_io.shipped_dir()),
                               settings=profile("quick", max_examples=examples, database=None))
    wall = time.perf_counter() - start
    return {"share": share, "examples": tally.examples, "graded": len(graded), "seconds": wall,
            "per_s": len(graded) / wall, "keys": len(keys), "findings": [f.verdict.label for f in findings]}


def _space(device: str, small: bool):
    from attnfuzz.strategies.space import Space
    space = Space.for_device(device)
    return space.replace(max_batch=2, max_len=64, max_heads=4, max_head_dim=64) if small else space


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", action="append", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--space", choices=("default", "small"), default="default")
    p.add_argument("--share", type=float, default=None, help="the compiled share of the parts' draws (default: the "
                   "Space's)")
    p.add_argument("--ipc-cases", type=int, default=20)
    p.add_argument("--rate", action="store_true", help="graded cases per second of the search, per compiled share")
    p.add_argument("--shares", default="0,0.8")
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--one", help=argparse.SUPPRESS)   # a rate round, run in a fresh process by --rate
    p.add_argument("--parts-one", action="store_true", help=argparse.SUPPRESS)   # one backend's parts, likewise
    args = p.parse_args()
    import torch
    torch.set_num_threads(1)
    small = args.space == "small"
    if args.one is not None:
        print(json.dumps(rate_once(args.backend[0], args.device, float(args.one), args.examples, args.seed, small)))
        return
    results = []
    if args.rate:
        shares = [float(s) for s in args.shares.split(",")]
        for name in args.backend:
            for r in range(args.rounds):
                for share in shares:
                    cmd = [sys.executable, __file__, "--backend", name, "--device", args.device, "--one", str(share),
                           "--examples", str(args.examples), "--seed", str(args.seed + r), "--space", args.space]
                    done = subprocess.run(cmd, capture_output=True, text=True)
                    if done.returncode != 0:
                        print(f"{name} share {share} round {r}: exit {done.returncode}\n{done.stderr[-2000:]}")
                        continue
                    one = {"backend": name, "round": r, **json.loads(done.stdout.strip().splitlines()[-1])}
                    results.append(one)
                    print(f"{name} round {r} share {share}: {one['graded']} graded of {one['examples']} in "
                          f"{one['seconds']:.1f} s = {one['per_s']:.2f}/s; {one['keys']} compile keys; findings "
                          f"{one['findings']}", flush=True)
    elif args.parts_one:
        from attnfuzz.backends import get
        space = _space(args.device, small)
        if args.share is not None:
            space = space.replace(compiled_share=args.share)
        print(json.dumps(parts(get(args.backend[0], args.device), args.device, space, args.cases, args.seed,
                               args.ipc_cases)))
        return
    else:   # each backend in a process of its own: one whose kernel breaks the CUDA context stops only itself
        for name in args.backend:
            cmd = [sys.executable, __file__, "--backend", name, "--device", args.device, "--parts-one", "--cases",
                   str(args.cases), "--seed", str(args.seed), "--space", args.space, "--ipc-cases",
                   str(args.ipc_cases)] + ([] if args.share is None else ["--share", str(args.share)])
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}")
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results.append(result)
            print(table(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
