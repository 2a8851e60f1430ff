"""The tolerance model: one function, one table.

A backend's value passes when

    max|got - f64|  <=  k * max|naive - f64|  +  floor

where `naive` is the reference run at the case's own dtype (a textbook implementation: logits, softmax and the
weighted sum all rounded to that dtype) and `floor` is a rounding allowance proportional to the values' magnitude.
This is flash-attention's rule ("no worse than 2x the error of a same-precision PyTorch implementation") with our
own k per family, output and dtype.

Why these k:
- A fused kernel keeps logits and the softmax in fp32 and rounds once, so it is usually *more* accurate than the
  naive baseline; k = 2 is flash-attention's own choice for that situation.
- We take 3 for outputs in fp16/bf16: the naive baseline rounds P to the dtype like the kernels do, but in a
  different order, and on small cases its error can land low by chance.
- fp32 and fp64 get 4: naive and kernel errors are then both pure accumulation-order noise of similar size, so the
  ratio between them is wider (measured over thousands of random cases, tests/test_tolerance_calibration.py).
- LSE is kept in fp32 by every kernel, so its baseline is the reference run in fp32 (not in the dtype, which would
  allow 100x too much for bf16); k = 2 for fp16/bf16 then, 4 for fp32/fp64 where both are rounding noise. Kernels
  use fast exp2 and blocked row sums, so the fp32 reference alone is too strict (torch's CPU flash kernel is off by
  5e-5 absolute on bf16 inputs whose LSE is ~1e-4; CUDA's efficient kernel 2.4e-4 on fp16): the LSE floor for
  fp16/bf16 adds half the dtype's eps, absolute. exp(lse + e) = exp(lse) * (1 + e), so an LSE error that small moves
  the weights by less than the output's own rounding.
- Gradients go through two more matmuls and a rowsum (dS = P * (dP - rowsum(dO * O))): k = 4 (flash-attention
  uses 2 plus a larger absolute floor).
The floor allows the final rounding of a correct value to the dtype, twice, and a rounding of every logit in the
precision kernels compute logits in (fp32, or fp64 for fp64 inputs), which moves a softmax-weighted value by up to
that error times the value: 2 * (eps(dtype) + eps(logits) * L) * max|f64|, plus 1e-7 absolute so an all-tiny output
is not graded on subnormals. L (the reference's `logit_size`) is what a logit's rounding scales with: the sum of its
dot product's terms, scale * sum_d |q_d k_d|, which is |logit| or larger when the terms cancel (CUDA's efficient
kernel, fp32, d = 64: an LSE 1.08 * eps * that sum off, where |logit| was 7% of it). (Without the logit term, fp32
cases with logits ~20 failed correct kernels: both the naive and the kernel error are then rounding noise, and the
naive one can land low.) Gradients that cancel (dQ is exactly 0 with one key) add (8 * eps(compute) + 2 *
eps(logits) * L) times a bound on the terms of the sum (oracles/grade.py, _gradient_terms): each weight P_ij carries its logit's rounding, and the sum
does not shrink that error when its terms cancel (fp32 dV with logits ~300 failed a correct kernel by 1.7x).
dQ and dK also add twice what they inherit from D = rowsum(dO * O) taken from the output rounded to the dtype, as
FlashAttention-style backward passes take it (cuDNN's fp16 dQ with |O| ~ 70 and K of mean 3 was 10x over without).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}

# k by quantity; a family row overrides the default for the dtypes it names.
K = {
    "default": {"out": {"float16": 3.0, "bfloat16": 3.0, "float32": 4.0, "float64": 4.0},
                "lse": {"float16": 2.0, "bfloat16": 2.0, "float32": 4.0, "float64": 4.0},
                "grad": {"float16": 4.0, "bfloat16": 4.0, "float32": 4.0, "float64": 4.0}},
}
LOW_PRECISION = ("float16", "bfloat16")
BIAS_IN_INPUT_DTYPE = ("sdpa",)  # families whose API takes ALiBi only as a bias in the input dtype


def k_for(family: str, quantity: str, dtype: str) -> float:
    table = K.get(family, {}).get(quantity, {})
    return table.get(dtype, K["default"][quantity][dtype])


@dataclass(frozen=True)
class Check:
    """One quantity graded: its error, the bound it had to meet, and the worst element."""

    name: str
    diff_max: float
    baseline_max: float
    k: float
    floor: float
    index: tuple[int, ...]
    got: float
    expected: float

    @property
    def bound(self) -> float:
        return self.k * self.baseline_max + self.floor

    @property
    def ok(self) -> bool:
        return self.diff_max <= self.bound

    @property
    def ratio(self) -> float:
        return self.diff_max / self.bound if self.bound > 0 else float("inf")

    def describe(self) -> str:
        return (f"{self.name}: diff_max={self.diff_max:.3e} baseline_max={self.baseline_max:.3e} k={self.k:g} "
                f"floor={self.floor:.3e} (ratio {self.ratio:.2f}) worst at {list(self.index)}: "
                f"got={self.got:.6g} expected={self.expected:.6g}")


def check(name: str, got: torch.Tensor, ref: torch.Tensor, naive: torch.Tensor, where: torch.Tensor, *,
          family: str, quantity: str, dtype: str, logit_size: float = 0.0, scale_of_terms: float = 0.0,
          inherited: float = 0.0, bias_max: float = 0.0) -> Check:
    """Grade `got` against the float64 `ref` at the elements `where` (bool, broadcast to got's shape); elements
    outside `where` are not graded. Non-finite values count as infinite error. `scale_of_terms` bounds the terms
    that sum to the value in the kernel's compute precision, where they can cancel: a gradient that is 0 in exact
    arithmetic comes out as fp32 rounding noise of the size of its terms, not of its own size. `inherited` is an
    absolute error a correct kernel carries in from a rounded input (a gradient's from D)."""
    got64, ref64, naive64 = got.to(torch.float64), ref.to(torch.float64), naive.to(torch.float64)
    where = where.expand_as(ref64)
    diff = torch.where(where, (got64 - ref64).abs(), torch.zeros((), dtype=torch.float64, device=ref64.device))
    diff = torch.where(where & ~torch.isfinite(got64), float("inf"), diff)
    diff = torch.nan_to_num(diff, nan=float("inf"))
    baseline = torch.where(where, (naive64 - ref64).abs().nan_to_num(nan=0.0, posinf=0.0), 0.0)
    magnitude = torch.where(where, ref64.abs(), 0.0).max().item() if where.any() else 0.0
    logit_eps = EPS["float64"] if dtype == "float64" else EPS["float32"]
    # Where ALiBi can only reach the kernel as a bias tensor in the input dtype (SDPA's additive float mask), each
    # logit carries that bias's rounding in the dtype too: the API's error, not the kernel's.
    logit_err = logit_eps * logit_size + (EPS[dtype] * bias_max if family in BIAS_IN_INPUT_DTYPE else 0.0)
    if quantity == "lse":  # absolute: exp(lse + e) = exp(lse) * (1 + e); kernels keep it in fp32
        low = dtype in LOW_PRECISION
        floor = (2 * (EPS[dtype] / 4 if low else 0.0)
                 + 2 * ((logit_eps if low else EPS[dtype]) + logit_err) * max(magnitude, 1.0) + 1e-7)
    else:
        floor = (2 * (EPS[dtype] + logit_err) * magnitude + (8 * logit_eps + 2 * logit_err) * scale_of_terms
                 + 2 * inherited + 1e-7)
    flat = int(torch.argmax(diff).item()) if diff.numel() else 0
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)) if diff.numel() else ()
    return Check(name=name, diff_max=diff.max().item() if diff.numel() else 0.0,
                 baseline_max=baseline.max().item() if baseline.numel() else 0.0,
                 k=k_for(family, quantity, dtype), floor=floor, index=index,
                 got=got64[index].item() if diff.numel() else 0.0,
                 expected=ref64[index].item() if diff.numel() else 0.0)
