"""The realized distribution: what the fuzz loop actually draws, per shape class, through the real search path.

    python3 bench/distribution.py [--max-len 1024] [--examples 200] [--device cpu] [--seed N] [--runs 3] [--grade]
                                  [--compile-share 0.8]

Cases come from attnfuzz.engine.harness.fuzz (Hypothesis's generation, the target phase, the Space narrowed to the
backend) for a stand-in backend that takes only bfloat16 and head dims >= 32. Without --grade the cases are not run:
a stand-in worker answers each with PASS and a ratio that varies with the case (what the target phase climbs on), or
UNSUPPORTED where the backend refuses it, so the figures are the strategy's and Hypothesis's alone. With --grade, a
correct CPU kernel (sdpa-math) runs and is graded (slow for long cases). Prints the shares of each class of
attnfuzz.report.coverage.SHAPE_CLASSES, refusals and repeats, summed over --runs runs with consecutive seeds, and
beside them the strategy's intent: the same Space drawn `--intent N` times from a plain random source (every
integer uniform in its range, every weighted coin at its weight), which is what the strategy's weights mean.
With --compile-share the stand-in declares FA4's compile key and the cases are drawn compile-aware
(strategies/compiled.py); either way the realized cases' configurations are counted and split by class (mask kind,
softcap, softmax, gradients, layout, GQA group).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from collections import Counter
from pathlib import Path

from attnfuzz.backends import get
from attnfuzz.backends.base import Backend, first_reason
from attnfuzz.engine.harness import cases_for, fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.report.coverage import Distribution
from attnfuzz.strategies.space import Space

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.jit_fake import fa4_like_key as jit_key  # noqa: E402


class Bf16Wide(Backend):
    """Takes bfloat16 with head dims >= 32 (the shape of many fused kernels' constraints), nothing else refused."""

    name = "bf16-d32"

    def __init__(self, inner: Backend | None = None):
        self.inner = inner

    def unsupported(self, case):
        return first_reason((case.dtype != "bfloat16", "bfloat16 only"),
                            (min(case.d_qk, case.d_v) < 32, "head dims >= 32 only"))

    def spellings(self, case):
        return self.inner.spellings(case) if self.inner is not None else super().spellings(case)

    def run(self, case, tensors):
        return self.inner.run(case, tensors)


class Bf16WideJit(Bf16Wide):
    """Bf16Wide that declares FA4's compile key (bench/jit_fake.py): its cases are drawn compile-aware."""

    name = "bf16-d32-jit"

    def compile_key(self, case):
        return jit_key(case)


CONFIG_CLASSES = {"mask": lambda c: c.mask_kind, "softcap": lambda c: c.softcap is not None,
                  "softmax": lambda c: c.softmax, "grads": lambda c: c.grads, "layout": lambda c: c.layout,
                  "GQA group": lambda c: c.h // c.hk}


def describe_configurations(cases) -> str:
    """Distinct compile keys, and the share of each class of the fields a compile key reads."""
    lines = [f"  configurations (FA4's compile key): {len({jit_key(c) for c in cases})} distinct in {len(cases)} cases"]
    for name, of in CONFIG_CLASSES.items():
        counts = Counter(of(c) for c in cases)
        lines.append(f"  {name:<10} " + "  ".join(f"{k}: {100 * n / len(cases):.1f}%" for k, n in
                                                  sorted(counts.items(), key=lambda kv: str(kv[0]))))
    return "\n".join(lines)


class StandIn:
    """A worker that grades nothing: UNSUPPORTED where the backend refuses, else PASS with a ratio in [0, 1) that
    depends on the case (a hash), so Hypothesis's target phase has something to climb."""

    def __init__(self, backend: Backend):
        self.backend = backend

    def run(self, case):
        reason = self.backend.unsupported(case)
        if reason is not None:
            return V.Verdict(V.UNSUPPORTED, None, reason)
        ratio = int(hashlib.sha1(repr(case).encode()).hexdigest()[:8], 16) / 2**32
        return V.Verdict(V.PASS, None, "", ratio=ratio)


class RandomSource:
    """What a strategy draws from, answered by Python's random: integers uniform in their range, booleans at their
    weight. No search, no shrinking, no constants: the strategy's weights as written."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def draw(self, strategy, label=None):
        return strategy.do_draw(self)

    def draw_integer(self, min_value=None, max_value=None, weights=None, **_):
        """Uniform, or with `weights` (value: probability), one of those values with its probability and a uniform
        value with what is left."""
        u = self.rng.random()
        for value, p in (weights or {}).items():
            if u < p:
                return value
            u -= p
        return self.rng.randint(min_value, max_value)

    def draw_boolean(self, p=0.5, **_):
        return self.rng.random() < p

    def start_span(self, *_, **__):
        pass

    def stop_span(self, *_, **__):
        pass


def intent(space: Space, backend: Backend, n: int, seed: int) -> Distribution:
    strategy, rng, drawn = cases_for(backend, space), random.Random(seed), Distribution()
    for _ in range(n):
        drawn.add(RandomSource(rng).draw(strategy))
    return drawn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--max-len", type=int, help="as the CLI's --max-len (default: the device's)")
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--grade", action="store_true", help="run and grade a correct CPU kernel instead of a stand-in")
    p.add_argument("--intent", type=int, default=5000, help="cases drawn from a plain random source (0: none)")
    p.add_argument("--compile-share", type=float, default=0.0,
                   help="draw compile-aware (a stand-in declaring FA4's compile key) with this share of cases inside "
                        "compiled configurations (0: plain)")
    args = p.parse_args()
    if not 0 <= args.compile_share < 1:
        p.error(f"--compile-share={args.compile_share}: give a share in [0, 1)")
    space = (Space.for_device(args.device, args.max_len) if hasattr(Space, "for_device")  # absent before 2k lengths
             else Space(max_len=args.max_len) if args.max_len else Space())
    if hasattr(space, "compiled_share"):
        space = space.replace(compiled_share=args.compile_share)
    drawn = Distribution()
    refused, cases = 0, []
    for run in range(args.runs):
        kind = Bf16WideJit if args.compile_share else Bf16Wide
        backend = kind(get("sdpa-math", args.device) if args.grade else None)
        worker = None if args.grade else StandIn(backend)
        seen = []

        def on_case(case, verdict, tally):
            seen.append((case, verdict))

        fuzz(backend, device=args.device, space=space, seed=args.seed + run, on_case=on_case, worker=worker,
             settings=profile("quick", max_examples=args.examples, database=None), reruns=0)
        for case, verdict in seen:
            drawn.add(case)
            cases.append(case)
            refused += verdict.status == V.UNSUPPORTED
    print(f"space: max_len={space.max_len}, max_head_dim={space.max_head_dim}; {args.runs} runs of {args.examples} "
          f"examples, seeds {args.seed}..{args.seed + args.runs - 1}; refused {100 * refused / max(drawn.cases, 1):.1f}%")
    print("realized (the fuzz loop):\n" + drawn.describe())
    print(describe_configurations(cases))
    if args.intent:
        print("intent (the strategy's weights, a plain random source):\n" + intent(space, Bf16Wide(), args.intent,
                                                                                 args.seed).describe())


if __name__ == "__main__":
    main()
