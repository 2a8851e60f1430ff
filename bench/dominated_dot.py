"""How far a backend's logit is off when one product dominates its dot product, against the head dim: the LSE of one
query over one key is that logit, so its error is the kernel's accumulation error of q.k alone.

    python3 bench/dominated_dot.py --backend sdpa-efficient --device cuda [--dims 64,128,256,512] [--seeds 20]
                                   [--dtype float16]

Cases: sq = skv = 1, outlier-channel values (one +-256 product, 65,536, in each dot; strategies/materialize.py),
scale 1. Per head dim: the largest and the median error over the seeds, in units of fp32's eps times the logit's
size (the grader's unit), beside what the grader allows a dominated dot (2 x tolerance.dot_ulps: 2 x max(1, sqrt(d) / 2,
d / 16 for fp16 / bf16)).
A kernel that rounds to nearest at each add stays near sqrt(d) / 2; one whose adder truncates each block of products
(GPU tensor cores: Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ Computer
Science 7:e330, 2021) grows with d itself.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from attnfuzz.backends import get
from attnfuzz.oracles.reference import reference
from attnfuzz.oracles.tolerance import dot_ulps
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import draw_on_cpu

EPS32 = 2.0**-23


def errors(backend, device: str, d: int, dtype: str, seeds: int) -> list[float]:
    """The LSE error of each seed's case, in units of eps(fp32) x |logit terms| (the reference's logit_size)."""
    out = []
    for seed in range(seeds):
        case = Case(sq=1, skv=1, d_qk=d, d_v=d, dtype=dtype, values="outlier_channel", scale=1.0, seed=seed)
        why = backend.unsupported(case)
        if why:
            raise SystemExit(f"dominated_dot.py: {backend.name} refuses d={d} {dtype}: {why}")
        drawn = draw_on_cpu(case)
        got = backend.run(case, drawn.to(device)).lse
        if got is None:
            raise SystemExit(f"dominated_dot.py: {backend.name} returns no LSE")
        ref = reference(case, drawn)
        out.append(abs(float(got.flatten()[0]) - float(ref.lse.flatten()[0])) / (EPS32 * ref.logit_size))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dims", default="64,128,256,512")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--dtype", default="float16")
    args = p.parse_args()
    try:
        dims = [int(x) for x in args.dims.split(",")]
    except ValueError:
        p.error(f"--dims {args.dims!r}: give head dims separated by commas, e.g. 64,128")
    backend = get(args.backend, args.device)
    why = backend.available()
    if why:
        raise SystemExit(f"dominated_dot.py: {args.backend} cannot run here: {why}")
    torch.set_num_threads(1)
    print(f"{args.backend} on {args.device}, {args.dtype}, {args.seeds} seeds: LSE error in eps(fp32) x logit size")
    print(f"{'d':>5}  {'max':>7}  {'median':>7}  {'allowed':>7}")
    for d in dims:
        e = errors(backend, args.device, d, args.dtype, args.seeds)
        allowed = 2 * dot_ulps(d, args.dtype)
        print(f"{d:>5}  {max(e):7.2f}  {statistics.median(e):7.2f}  {allowed:7.2f}")


if __name__ == "__main__":
    main()
