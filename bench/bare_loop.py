"""The yardstick for the fuzz loop's overhead: a bare hand-written property test, no attnfuzz.

    python3 bench/bare_loop.py [--examples 500] [--device cuda --kernel flash]

Hypothesis @given draws small shapes (b <= 2, s <= 64, h <= 4 with GQA, d <= 64, float16 / bfloat16 / float32,
causal or not, gradients or not), calls the same kernel as the sdpa-math backend (torch SDPA forced to MATH, on the
CPU; with --kernel flash, sdpa-flash's: SDPA forced to FLASH_ATTENTION, drawing only what it takes: half precision,
no GQA, causal only where sq = skv) and compares its output (and dq, dk, dv) to a float64 reference written out in torch with allclose.
bench/throughput.py runs it in the same process as the attnfuzz loop and prints the ratio of their rates.
"""

from __future__ import annotations

import argparse
import time

import hypothesis
import torch
from hypothesis import strategies as st

TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 8e-2, torch.float32: 1e-4}


@st.composite
def shapes(draw, flash: bool = False):
    hk = draw(st.integers(1, 4))
    s = {"b": draw(st.integers(1, 2)), "sq": draw(st.integers(1, 64)), "skv": draw(st.integers(1, 64)),
         "hk": hk, "h": hk * draw(st.integers(1, 4 // hk)), "d": draw(st.sampled_from([8, 16, 32, 64])),
         "dtype": draw(st.sampled_from(list(TOLERANCE)[:2] if flash else list(TOLERANCE))),
         "causal": draw(st.booleans()), "grads": draw(st.booleans())}
    if flash:   # what SDPA's flash kernel takes
        s.update(h=hk, causal=s["causal"] and s["sq"] == s["skv"])
    return s


def reference(q, k, v, causal: bool):
    """Float64 attention over [b, h, s, d] tensors (GQA by repeating the KV heads), causal top-left."""
    q, k, v = (x.double() for x in (q, k, v))
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        hidden = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    return (scores.softmax(-1).nan_to_num(0.0)) @ v


def check(s: dict, device: str = "cpu", kernel: str = "math") -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dtype, atol = s["dtype"], TOLERANCE[s["dtype"]]
    made = {"dtype": dtype, "device": device, "requires_grad": s["grads"]}
    q = torch.randn(s["b"], s["h"], s["sq"], s["d"], **made)
    k = torch.randn(s["b"], s["hk"], s["skv"], s["d"], **made)
    v = torch.randn(s["b"], s["hk"], s["skv"], s["d"], **made)
    chosen = SDPBackend.FLASH_ATTENTION if kernel == "flash" else SDPBackend.MATH
    with sdpa_kernel([chosen]), torch.set_grad_enabled(s["grads"]):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=s["causal"], enable_gqa=True)
    leaves = [x.detach().double().requires_grad_(s["grads"]) for x in (q, k, v)]
    with torch.set_grad_enabled(s["grads"]):
        want = reference(*leaves, s["causal"])
    assert torch.allclose(out.detach().double(), want.detach(), atol=atol, rtol=atol)
    if s["grads"]:
        dout = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), dout)
        wanted = torch.autograd.grad(want, leaves, dout.double())
        for g, w in zip(got, wanted):
            assert torch.allclose(g.double(), w, atol=10 * atol, rtol=10 * atol)


def run(examples: int, seed: int | None = None, device: str = "cpu", kernel: str = "math") -> tuple[int, float]:
    """Cases checked and the seconds they took."""
    seen = [0]

    @hypothesis.settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(s=shapes(flash=kernel == "flash"))
    def bare(s) -> None:
        seen[0] += 1
        check(s, device, kernel)

    if seed is not None:
        bare = hypothesis.seed(seed)(bare)
    start = time.perf_counter()
    bare()
    return seen[0], time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--examples", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--kernel", default="math", choices=("math", "flash"))
    args = p.parse_args()
    torch.set_num_threads(1)
    run(20, device=args.device, kernel=args.kernel)  # warm-up
    n, seconds = run(args.examples, args.seed, args.device, args.kernel)
    print(f"bare loop: {n} cases in {seconds:.2f}s = {n / seconds:.1f} cases/s")


if __name__ == "__main__":
    main()
