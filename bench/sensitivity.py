"""How small a bug the grader sees: planted kernels (bench/planted.py, a trusted CPU kernel with one bug each) graded
by the project's own `grade` on long rows, in fp16, bf16 and fp32.

    python3 bench/sensitivity.py [--quick] [--cases N] [--lengths 128,1024,4096] [--dtypes ...] [--bugs ...]
                                 [--fuzz N]

For each bug, dtype, length S (sq = skv = S, or skv = 5S/4 bottom-right) and input family (random values; probes
where the case language has them) it prints `FAIL / active`: the cases where the bug changed something, and how many
of those the grader failed, output only and with the LSE graded (gradient bugs: out, dQ, dK, dV; `control_grads`:
the correct kernel's out, dQ, dK, dV). The kernels are graded as their tolerance family (bench/planted.py). Each case draws a
band (causal at either alignment, a sliding window, causal + left window, padding) and a row to plant the bug on.
`smallest eps` is the median over cases of the smallest eps for which the last valid row x (1 + eps) fails (output
only). `--fuzz N` also runs each planted kernel through the fuzzer (`fuzz()` with N examples, lengths up to
`--fuzz-len`) and says whether it found the bug.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.planted, as `attnfuzz run --backend bench.planted:...` finds it from the root

import torch  # noqa: E402

from attnfuzz.backends.custom import load_custom  # noqa: E402
from attnfuzz.oracles import grade as grade_module  # noqa: E402
from attnfuzz.oracles.grade import Oracle, grade  # noqa: E402
from attnfuzz.oracles.verdict import Output  # noqa: E402
from attnfuzz.strategies.case import Case  # noqa: E402
from attnfuzz.strategies.materialize import materialize  # noqa: E402
from bench import planted  # noqa: E402

FIELDS = {f.name for f in dataclasses.fields(Case)}
FAMILIES = ("gaussian", "probe") if "values" in FIELDS else ("gaussian",)
# The planted kernels' tolerance family (their gradients: fp32 autograd, graded against the fused baseline)
FAMILY = getattr(planted.correct, "family", "default")


def quiet_diagnosis() -> None:
    """The benchmark counts FAIL against PASS; naming a failure re-runs float64 references against alternatives,
    which at S = 4096 costs more than the rest. Diagnoses are tested in tests/test_grade.py."""
    def undiagnosed(o, out, failed, family, *args, **kwargs):
        return grade_module.fail("TOLERANCE", failed.describe(), failed, failed.ratio)
    grade_module.diagnose = undiagnosed


def draw_case(rng: random.Random, dtype: str, s: int, family: str, grads: bool) -> Case:
    kind = rng.choice(("causal", "window", "causal_left", "padding"))
    alignment = rng.choice(("top_left", "bottom_right"))
    skv = s if alignment == "top_left" or rng.random() < 0.5 else s + s // 4
    fields = dict(b=1, sq=s, skv=skv, h=2, hk=rng.choice((1, 2)), d_qk=64, d_v=64, dtype=dtype, alignment=alignment,
                  seed=rng.randrange(2**32), grads=grads)
    if kind == "causal":
        fields["causal"] = True
    elif kind == "window":
        fields["window"] = (rng.randrange(0, s), rng.randrange(0, max(s // 8, 1)))
    elif kind == "causal_left":
        fields.update(causal=True, window=(rng.randrange(s // 8, s), None))
    else:
        fields.update(b=2, seqlens_q=(s, rng.randrange(s // 2, s + 1)),
                      seqlens_kv=(rng.randrange(s // 2, skv), rng.randrange(s // 2, skv + 1)))
    if family != "gaussian":
        fields["values"] = family
    return Case(**fields)


def smallest_eps(case: Case, t, oracle: Oracle, out: torch.Tensor) -> float:
    """The smallest eps (to a factor 1.25) for which the last valid row of head -1, sequence 0, x (1 + eps) fails."""
    last = case.lens_q[0] - 1

    def fails(eps: float) -> bool:
        bad = out.clone()
        bad[0, last, -1] = (bad[0, last, -1].double() * (1 + eps)).to(bad.dtype)
        return grade(case, t, Output(bad), oracle=oracle, family=FAMILY).failed

    lo, hi = 1e-8, 16.0
    if not fails(hi):
        return float("inf")
    while hi / lo > 1.25:
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if fails(mid) else (mid, hi)
    return hi


def run_cell(dtype: str, s: int, family: str, cases: int, seed: int, tally, eps_seen, bugs=None) -> None:
    rng = random.Random(f"{seed}-{dtype}-{s}-{family}")
    for _ in range(cases):
        case = draw_case(rng, dtype, s, family, grads=True)
        fwd = case.replace(grads=False)
        t = materialize(case)
        oracle = Oracle.of(case, t, family=FAMILY)
        n = case.lens_q[0]
        for name, attribute in planted.BUGS.items():
            backend = load_custom(f"bench.planted:{attribute}")
            planted.PLANT["row"] = rng.randrange(n) if n else 0  # drawn for every bug: --bugs keeps the rows
            if bugs is not None and name not in bugs:
                continue
            graded_case = case if name in planted.GRADIENT_BUGS else fwd
            output = backend.run(graded_case, t)
            if not planted.LAST["active"] or n == 0:
                continue
            key = (name, dtype, s, family)
            tally[key + ("active",)] += 1
            if name in planted.GRADIENT_BUGS:
                tally[key + ("out",)] += grade(case, t, dataclasses.replace(output, lse=None), oracle=oracle,
                                               family=FAMILY).failed
                continue
            tally[key + ("out",)] += grade(fwd, t, Output(output.out), oracle=oracle, family=FAMILY).failed
            tally[key + ("lse",)] += grade(fwd, t, Output(output.out, lse=output.lse), oracle=oracle,
                                           family=FAMILY).failed
        planted.PLANT["row"] = None
        correct = load_custom("bench.planted:correct").run(case, t)
        control = grade(fwd, t, Output(correct.out), oracle=oracle, family=FAMILY)
        tally[("control", dtype, s, family, "active")] += 1
        tally[("control", dtype, s, family, "out")] += control.failed
        control = grade(case, t, dataclasses.replace(correct, lse=None), oracle=oracle, family=FAMILY)
        tally[("control_grads", dtype, s, family, "active")] += 1
        tally[("control_grads", dtype, s, family, "out")] += control.failed
        if n:
            eps_seen[(dtype, s, family)].append(smallest_eps(fwd, t, oracle, correct.out))


def fuzz_finds(names, examples: int, max_len: int, seed: int) -> dict:
    from attnfuzz.engine.harness import fuzz
    from attnfuzz.engine.profiles import profile
    from attnfuzz.strategies.space import Space
    found = {}
    for name in names:
        spec = f"bench.planted:{planted.BUGS[name]}"
        planted.PLANT["row"] = None
        tally, findings = fuzz(load_custom(spec), space=Space(max_len=max_len),
                               settings=profile("quick", max_examples=examples, derandomize=True), seed=seed,
                               reruns=0)
        found[name] = ", ".join(sorted({f.verdict.label for f in findings})) or f"not found in {tally.examples}"
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="S in 128,1024; 3 cases per cell; no fuzz runs")
    p.add_argument("--cases", type=int, default=8, help="cases per (dtype, S, family) cell (default 8; S = 4096 "
                                                        "gets half)")
    p.add_argument("--lengths", default="128,1024,4096")
    p.add_argument("--dtypes", default="float16,bfloat16,float32")
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--bugs", default=None, help="comma-separated bugs to plant (default: all of bench/planted.BUGS)")
    p.add_argument("--fuzz", type=int, default=0, metavar="N", help="also fuzz each planted kernel for N examples")
    p.add_argument("--fuzz-len", type=int, default=1024, help="longest sequence the fuzz runs draw (default 1024)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    lengths = [int(x) for x in ("128,1024" if args.quick else args.lengths).split(",")]
    cases = 3 if args.quick else args.cases
    torch.set_num_threads(1)
    quiet_diagnosis()
    bugs = args.bugs.split(",") if args.bugs else None
    unknown = sorted(set(bugs or ()) - set(planted.BUGS))
    if unknown:
        p.error(f"--bugs: unknown {', '.join(unknown)}; choose from {', '.join(planted.BUGS)}")
    tally, eps_seen = defaultdict(int), defaultdict(list)
    start = time.time()
    for s in lengths:
        for dtype in args.dtypes.split(","):
            for family in args.families.split(","):
                run_cell(dtype, s, family, max(1, cases // 2) if s >= 4096 else cases, args.seed, tally, eps_seen,
                         bugs)
        print(f"# S = {s} done after {time.time() - start:.0f} s", file=sys.stderr)
    report(tally, eps_seen, lengths, args.dtypes.split(","), args.families.split(","), bugs)
    if args.fuzz:
        print(f"\n## Found by a fuzz run ({args.fuzz} examples, lengths up to {args.fuzz_len}, seed {args.seed})\n")
        print("| bug | found |\n|---|---|")
        for name, what in fuzz_finds(list(planted.BUGS), args.fuzz, args.fuzz_len, args.seed).items():
            print(f"| {name} | {what} |")
    print(f"\n({time.time() - start:.0f} s)")


def report(tally, eps_seen, lengths, dtypes, families, bugs=None) -> None:
    cols = [(s, f) for s in lengths for f in families]
    head = " | ".join(f"S={s} {f[:5]}" for s, f in cols)
    print("Cells: FAIL / cases where the bug is active (output only; with the LSE graded; gradient bugs: out + "
          "grads, no LSE)\n")
    print(f"| bug | dtype | {head} |\n|---|---|{'---|' * len(cols)}")
    for name in ("control", "control_grads", *(bugs or planted.BUGS)):
        for dtype in dtypes:
            cells = []
            for s, f in cols:
                key = (name, dtype, s, f)
                active = tally[key + ("active",)]
                if not active:
                    cells.append("-")
                elif name in planted.GRADIENT_BUGS or name.startswith("control"):
                    cells.append(f"{tally[key + ('out',)]}/{active}")
                else:
                    cells.append(f"{tally[key + ('out',)]}/{active} ({tally[key + ('lse',)]} lse)")
            print(f"| {name} | {dtype} | {' | '.join(cells)} |")
    print("\nSmallest eps caught, last row x (1 + eps), output only (median over cases):\n")
    print(f"| dtype | {head} |\n|---|{'---|' * len(cols)}")
    for dtype in dtypes:
        cells = []
        for s, f in cols:
            seen = eps_seen[(dtype, s, f)]
            cells.append(f"{statistics.median(seen):.2g}" if seen else "-")
        print(f"| {dtype} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
