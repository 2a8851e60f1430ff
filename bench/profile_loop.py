"""Where the fuzz loop's time goes, per function: cProfile of `fuzz` on one backend, after a warm-up.

    python3 bench/profile_loop.py --backend sdpa-math --device cuda --examples 400

Prints the functions with the most cumulative time inside attnfuzz (strategies/, oracles/, fuzz/) and torch's ops,
so a throughput change can be aimed at what costs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

from attnfuzz.backends import get
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.strategies.space import Space

SMALL = Space(max_batch=2, max_len=64, max_heads=4, max_head_dim=64)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="sdpa-math")
    p.add_argument("--device", default="cpu")
    p.add_argument("--examples", type=int, default=400)
    p.add_argument("--top", type=int, default=45)
    args = p.parse_args()
    import torch
    torch.set_num_threads(1)
    backend = get(args.backend, args.device)
    fuzz(backend, device=args.device, space=SMALL, settings=profile("ci", max_examples=30))  # warm-up
    settings = profile("ci", max_examples=args.examples, derandomize=False)
    prof = cProfile.Profile()
    prof.enable()
    tally, _ = fuzz(backend, device=args.device, space=SMALL, settings=settings)
    prof.disable()
    print(f"{args.backend} on {args.device}: {tally.examples} examples in {tally.seconds:.2f}s "
          f"({tally.examples / tally.seconds:.1f}/s), {dict(tally.labels)}")
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).sort_stats("cumulative")
    stats.print_stats(r"(attnfuzz|/strategies/|/oracles/|/fuzz/|torch/_tensor|built-in method torch|cuda)", args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
