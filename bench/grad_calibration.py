"""False alarms of the fused gradient grading: correct kernels' fp16 / bf16 gradients graded as the "fused" family
(oracles/tolerance.py, FUSED_BACKWARD) on many random cases.

    python3 bench/grad_calibration.py [--cases 3000] [--max-len 96] [--seed 0] [--dtypes float16,bfloat16]
    python3 bench/grad_calibration.py --device cuda --kernels sdpa-flash,sdpa-efficient,sdpa-cudnn,fa2 --cases 1000
    python3 bench/grad_calibration.py --device cuda --kernels sdpa-flash --max-len 4096 --min-len 512 --plant 0.05

The kernels: torch's CPU sdpa-math (upcasts to fp32, D exact) and sdpa-flash (P and dS rounded to the dtype, D taken
from its own rounded output), bench/planted.py's fp32 kernel and FlashAttention-2's algorithm written out
(tests/fused_kernels.py: D from the rounded output). Cases come from the case strategy (a plain layout, the vanilla
softmax, gradients on) with a random source seeded by --seed, so two seeds give two samples. Prints, per kernel,
dtype and gradient, the cases graded, the failures and the largest error / bound; then the worst check and its case
for each cell above --show (0.8), and the first failures. Exit 1 when a correct kernel failed. `--kernels` grades
registry backends instead (on --device), as if they were of the fused family: the evidence a GPU family needs
before it joins FUSED_BACKWARD. A kernel that refuses a case, or raises on it, is left out of that case.
`--plant EPS` also grades each kernel's gradients with one row planted wrong, the row of each gradient with the
largest entry times (1 + EPS), and counts the catches (the negative control: a bound loose enough to pass everything
would catch none); `--plant 0.05` is the bf16 one-row x 1.05 bug of docs/grading.md. `--min-len N` raises each
case's query and key lengths to N at least (cases of packed sequences are left out): the long rows on which
bench/sensitivity.py measures the same bug on the CPU, where a short row's bound is a larger share of it.
`--equal-head-dims` draws d_v = d_qk only: for a kernel whose known bug with split head dims kills the process
(FA4 4.0.0b36 on sm90 exits there), which would end the calibration with it.
A kernel run whose gradients fail is graded as the fuzzer grades it (the kernel's own family); where a known-bug
record of `--known` (default: the shipped corpus) takes that failure, the run is a known bug of the kernel, not a
calibration point: it is left out of the table and counted under its record. `--budget-s` stops drawing cases
after that many seconds and prints what was graded (a GPU call with a time limit still gets its table).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.planted and tests.fused_kernels, from the repository root

import torch  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from attnfuzz.backends import get  # noqa: E402
from attnfuzz.backends.custom import load_custom  # noqa: E402
from attnfuzz.oracles.grade import Oracle, grade, gradient_check  # noqa: E402
from attnfuzz.oracles.verdict import Output  # noqa: E402
from attnfuzz.store import corpus as corpus_io  # noqa: E402
from attnfuzz.strategies.cases import attention_cases  # noqa: E402
from attnfuzz.strategies.materialize import materialize  # noqa: E402
from attnfuzz.strategies.space import Space  # noqa: E402
from tests.fused_kernels import flash_algorithm_backward  # noqa: E402

FAMILY = "fused"
GRADS = ("dq", "dk", "dv")


def _ran(backend, case, t):
    try:
        return backend.run(case, t)
    except Exception:  # a refusal at call time, or a crash: the fuzzer's to report, not a calibration point
        return None


def outputs(case, t, kernels) -> dict:
    """Each kernel's Output on the case (those that support it). SDPA takes ALiBi only as a bias in the input dtype,
    an error of its API that its own family is allowed (tolerance.BIAS_IN_INPUT_DTYPE) and the fused family is not:
    its kernels run here without ALiBi (sdpa-math bf16 with slopes up to 0.4: dQ 1.65x over the fused bound)."""
    got = {name: _ran(b, case, t) for name, b in kernels.items() if b.unsupported(case) is None
           and not (name.startswith("sdpa") and case.alibi_slopes is not None)}
    got = {name: out for name, out in got.items() if out is not None and out.dq is not None}
    if case.softcap is None and case.alibi_slopes is None and case.d_qk == case.d_v and t.q.device.type == "cpu":
        out, *grads = flash_algorithm_backward(case, t)
        got["flash-algorithm"] = Output(out, **dict(zip(("dq", "dk", "dv"), (g.to(t.q.dtype) for g in grads))))
    return got


def planted_row(grad: torch.Tensor, eps: float) -> torch.Tensor:
    """`grad` [b, s, h, d] with the row (one token of one head) holding its largest |entry| times (1 + eps), in
    its own dtype (where rounding leaves that row unchanged, the result equals `grad`)."""
    flat = grad.detach().float().abs().amax(-1)                 # [b, s, h]
    b, s, h = (int(i) for i in torch.unravel_index(flat.argmax(), flat.shape))
    out = grad.detach().clone()
    out[b, s, h] = (out[b, s, h].float() * (1 + eps)).to(out.dtype)
    return out


def known_bug(known, kernel, case, t, output, device: str) -> dict | None:
    """The known-bug record that takes this run's failure as the fuzzer would grade it (the kernel's own family),
    or None: no record, no failure there, or no registry kernel (the written-out flash algorithm)."""
    if known is None or kernel is None:
        return None
    oracle = Oracle.of(case, t, device=device, family=kernel.family)
    verdict = grade(case, t, output, family=kernel.family, oracle=oracle)
    return known(kernel.name, case, verdict) if verdict.failed else None


def calibration_space(max_len: int, dtypes: tuple[str, ...], equal_head_dims: bool = False) -> Space:
    """The cases graded: a plain layout and buffer, the vanilla softmax, gradients on; d_v = d_qk only if asked.
    Plain buffers: a tensor one element into its buffer faults fused CUDA kernels (misaligned address), which ends
    the process's CUDA context; those are the fuzzer's findings, not calibration points."""
    return Space(layouts=("bshd",), softmaxes=("vanilla",), grads=True, max_len=max_len, dtypes=dtypes,
                 storages=("plain",), split_head_dims=not equal_head_dims)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=3000)
    p.add_argument("--max-len", type=int, default=96)
    p.add_argument("--min-len", type=int, default=1,
                   help="raise each case's sq and skv to at least this (packed cases are left out)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--equal-head-dims", action="store_true", help="draw d_v = d_qk only")
    p.add_argument("--dtypes", default="float16,bfloat16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--kernels", help="registry backends (or MODULE:FUNCTION kernels) to grade as fused, "
                                      "comma-separated (default: the CPU set)")
    p.add_argument("--show", type=float, default=0.8, help="print the worst case of each cell above this ratio")
    p.add_argument("--plant", type=float, default=None, metavar="EPS",
                   help="also grade each gradient with its largest row times (1 + EPS) and count the catches")
    p.add_argument("--known", action="append", metavar="DIR",
                   help="a corpus folder whose known bugs leave a failing run out (repeatable; default the shipped "
                        "corpus; 'none': no record)")
    p.add_argument("--budget-s", type=float, default=None, help="stop drawing cases after this many seconds")
    args = p.parse_args()
    dtypes = tuple(args.dtypes.split(","))
    bad = sorted(set(dtypes) - {"float16", "bfloat16"})
    if bad:
        p.error(f"--dtypes: {', '.join(bad)} has no fused baseline (fp32 / fp64 gradients round nothing before the "
                f"end); choose float16 and / or bfloat16")
    torch.set_num_threads(1)
    if args.kernels:
        kernels = {name: load_custom(name) if ":" in name else get(name, args.device)
                   for name in args.kernels.split(",")}
    else:
        kernels = {"sdpa-math": get("sdpa-math", args.device), "sdpa-flash": get("sdpa-flash", args.device),
                   "planted": load_custom("bench.planted:correct")}
    missing = {name: b.available() for name, b in kernels.items() if b.available() is not None}
    if missing:
        p.error("--kernels: " + "; ".join(f"{name}: {why}" for name, why in missing.items()))
    if not 1 <= args.min_len <= args.max_len:
        p.error(f"--min-len {args.min_len}: give a length from 1 to --max-len ({args.max_len})")
    folders = args.known or [str(corpus_io.shipped_dir())]
    try:
        known = None if folders == ["none"] else corpus_io.known_bugs(*map(Path, folders))
    except corpus_io.CorpusError as e:
        p.error(f"--known: {e}")
    space = calibration_space(args.max_len, dtypes, args.equal_head_dims)
    graded, failed, worst, worst_case = Counter(), Counter(), defaultdict(float), {}
    planted, caught = Counter(), Counter()
    known_runs: Counter = Counter()   # (kernel, dtype, record id) -> runs a known bug took
    failures: list[str] = []
    missed: list[str] = []  # planted rows that passed
    start = time.time()

    @seed(args.seed)
    @settings(max_examples=args.cases, database=None, deadline=None, derandomize=False, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(case=attention_cases(space))
    def run(case):
        if case.paged or (args.min_len > 1 and case.seqlens_q is not None):
            return
        if args.budget_s is not None and time.time() - start > args.budget_s:
            return   # out of time: the rest of the examples are drawn and dropped, which takes moments
        case = case.replace(grads=True, sq=max(case.sq, args.min_len), skv=max(case.skv, args.min_len))
        t = materialize(case, args.device)
        oracle = Oracle.of(case, t, device=args.device, family=FAMILY)
        for name, output in outputs(case, t, kernels).items():
            checks = {grad: gradient_check(oracle, grad, getattr(output, grad), FAMILY, output.out) for grad in GRADS}
            if not all(c.ok for c in checks.values()):
                bug = known_bug(known, kernels.get(name), case, t, output, args.device)
                if bug is not None:
                    known_runs[(name, case.dtype, bug["id"])] += 1
                    continue
            for grad, c in checks.items():
                got = getattr(output, grad)
                key = (name, case.dtype, grad)
                graded[key] += 1
                if c.ratio >= worst[key]:
                    worst[key], worst_case[key] = c.ratio, f"{c.describe()} {case!r}"
                if not c.ok:
                    failed[key] += 1
                    failures.append(f"{name} {c.describe()} {case!r}")
                if args.plant is not None and got.numel():
                    wrong = planted_row(got, args.plant)
                    if not torch.equal(wrong, got):  # a row rounding leaves unchanged is no plant
                        planted[key] += 1
                        check = gradient_check(oracle, grad, wrong, FAMILY, output.out)
                        caught[key] += not check.ok
                        if check.ok:
                            missed.append(f"missed {name} {grad} x {1 + args.plant:g} ({check.ratio:.2f} of the "
                                          f"bound) {case!r}")

    run()
    print(f"{sum(graded.values()) // 3} kernel runs graded in {time.time() - start:.0f} s (seed {args.seed}, "
          f"max_len {args.max_len}, min_len {args.min_len})\n")
    plant = "" if args.plant is None else f" one row x {1 + args.plant:g}: caught / planted |"
    print(f"| kernel | dtype | gradient | graded | FAIL | worst error / bound |{plant}\n"
          f"|---|---|---|---|---|---|{'---|' if plant else ''}")
    for key in sorted(graded):
        cell = "" if args.plant is None else f" {caught[key]} / {planted[key]} |"
        print(f"| {' | '.join(key)} | {graded[key]} | {failed[key]} | {worst[key]:.2f} |{cell}")
    for key in sorted(graded):
        if worst[key] > args.show:
            print(f"worst {' '.join(key)}: {worst_case[key]}")
    for (name, dtype, bug), runs in sorted(known_runs.items()):
        print(f"known bug, left out: {name} {dtype}: {runs} run(s) taken by {bug}")
    for line in failures[:10] + missed[:10]:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
