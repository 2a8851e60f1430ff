"""Time of the float64 oracle (reference out + LSE, and the naive same-dtype baseline) per case, on CPU or CUDA.

    python3 bench/oracle_time.py [--device cpu] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from attnfuzz.oracles.grade import Oracle
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize

SHAPES = {
    "small  (b=2, s=64, h=4/2, d=64, causal)": Case(b=2, sq=64, skv=64, h=4, hk=2, d_qk=64, d_v=64,
                                                     dtype="bfloat16", causal=True),
    "small + grads": Case(b=2, sq=64, skv=64, h=4, hk=2, d_qk=64, d_v=64, dtype="bfloat16", causal=True, grads=True),
    "large  (b=1, s=4096, h=8/2, d=128, causal)": Case(b=1, sq=4096, skv=4096, h=8, hk=2, d_qk=128, d_v=128,
                                                        dtype="bfloat16", causal=True),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for label, case in SHAPES.items():
        t = materialize(case, args.device)
        Oracle.of(case, t)  # warm-up
        runs = 20 if case.sq <= 64 else 1
        start = time.perf_counter()
        for _ in range(runs):
            Oracle.of(case, t)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        print(f"{label}: {(time.perf_counter() - start) / runs * 1e3:.1f} ms per case on {args.device}")


if __name__ == "__main__":
    main()
