"""The tolerance model: one function, one table.

A backend's value passes when, on every row (an output or dQ row: one batch, query and head; a dK / dV row: one
batch, key and KV head; an LSE: one value),

    max|got - f64|  <=  k * max|naive - f64|  +  floor        (maxima over the row's channels)

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
  allow 100x too much for bf16); k = 2 for fp16/bf16 then, 4 for fp32/fp64 where both are rounding noise. Its floor
  is what computing an LSE in fp32 can lose, per row, absolute (exp(lse + e) = exp(lse) * (1 + e)): the logits are
  fp32 sums of exact products, each off by up to eps(fp32) * L_i, and the LSE is their weighted mean plus log of a
  sum, so 2 * eps(logits) * L_i; the final log and the add of the row maximum, 2 * eps(fp32) * max(|lse_i|, 1); the
  row sum's adds over n keys, eps(fp32) * sqrt(n) (six standard deviations of a sequential sum); and
  for fp16 / bf16 inputs an allowance for the fast exp of reduced-precision paths, FAST_EXP below (it replaces half
  the dtype's eps, 2^-8 absolute in bf16, which was 66x what a real kernel shows).
- Gradients go through two more matmuls and a rowsum (dS = P * (dP - rowsum(dO * O))): k = 4 (flash-attention
  uses 2 plus a larger absolute floor).
Why per row: the error and the bound used to be maxima over the whole tensor, and the bound scaled with the largest
reference value (row 0 of a causal case, |V_0| ~ 3), while a long row's output is ~1/sqrt(n): an element had to be
off by several times its own row's size before it counted, and one wrong key on a row of 4096 never did. Each row
now meets its own baseline and its own magnitude; the verdict names the worst row (the largest error / bound).
The floor allows the final rounding of a correct value to the dtype, u = eps / 2 of the row's largest value, twice
for an output row (eps(dtype) * max_row|f64|; four times for gradients), and a rounding of every logit in the
precision kernels compute logits in (fp32, or fp64 for fp64 inputs): a weight's relative error e moves an output row
by at most e * sum_j P_ij |V_j - O_i| <= 2 e * sum_j P_ij |V_j| (the row's `spread`, which the reference computes),
so the output floor adds 2 * eps(logits) * L_i * spread_i, and for fp16 / bf16 six standard deviations of P's
rounding and of a fast exp (see check: those errors do not conspire); gradients keep 2 * eps(logits) * L *
max_row|f64|, with the same random walk over a dominated dot product (dominated_dot) as the forward's: a backward
recomputes the logits, in its own order, against the forward's LSE (torch's CPU flash fp32 dV of a far_negative case). Plus 1e-7 absolute so an all-tiny row is not graded on subnormals. L_i (the
reference's `row_logit_size`, its maximum `logit_size`) is what a logit's rounding scales with: the sum of its
dot product's terms, scale * sum_d |q_d k_d|, which is |logit| or larger when the terms cancel (CUDA's efficient
kernel, fp32, d = 64: an LSE 1.08 * eps * that sum off, where |logit| was 7% of it). (Without the logit term, fp32
cases with logits ~20 failed correct kernels: both the naive and the kernel error are then rounding noise, and the
naive one can land low.) Gradients that cancel (dQ is exactly 0 with one key) add (8 * eps(compute) + 2 *
eps(logits) * L) times a bound on the terms of the sum (oracles/grade.py, _gradient_terms): each weight P_ij
carries its logit's rounding, and the sum does not shrink that error when its terms cancel (fp32 dV with logits ~300 failed a correct kernel by 1.7x).
dQ and dK also add twice what they inherit from D = rowsum(dO * O) taken from the output rounded to the dtype, as
FlashAttention-style backward passes take it (cuDNN's fp16 dQ with |O| ~ 70 and K of mean 3 was 10x over without):
against the textbook baseline the worst row's shift on every row; against the fused one each row's own, from the
output the kernel returned (oracles/grade.py, d_inherited).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}

# k by quantity; a family row overrides the default for the dtypes it names.
K = {
    "default": {"out": {"float16": 3.0, "bfloat16": 3.0, "float32": 4.0, "float64": 4.0},
                "lse": {"float16": 2.0, "bfloat16": 2.0, "float32": 4.0, "float64": 4.0},
                "grad": {"float16": 4.0, "bfloat16": 4.0, "float32": 4.0, "float64": 4.0}},
}
LOW_PRECISION = ("float16", "bfloat16")
# How many standard deviations of P's rounding an output row may be off by (see check): 6 leaves about one row in
# 10^9 of a correct kernel over its bound from this alone, and a leaked key on a row of 1024 still 5x over.
P_ROUNDING_SIGMAS = 6.0
# A rounding error spread evenly over +-u has a standard deviation of u / sqrt(3): the sigmas above count those.
UNIFORM_SD = 3.0 ** -0.5
# torch's CPU flash kernel on fp16 and bf16 inputs takes a fast exp: its LSE is off by up to 6.2e-5 absolute,
# the same in both dtypes and whatever the head dim (measured on rows of 2 to 1024 keys; with one key, where the
# only exp is exp(0), it is off by 3e-8), i.e. a relative error of the row sum up to ~2^-14. Twice that, 2^-13 =
# 1.2e-4, is the allowance. (CUDA's efficient kernel was 2.4e-4 off on fp16, but on a row with large logits, which
# the per-row logit term now carries: 2 * eps(fp32) * L_i.)
FAST_EXP = 2.0**-13
# families whose API takes ALiBi only as a bias in the input dtype
BIAS_IN_INPUT_DTYPE = ("sdpa", "sdpa-efficient", "sdpa-cudnn")
# Families whose fp32 matmuls run as 3xTF32 on tensor cores (CUTLASS's OpMultiplyAddFastF32): torch's memory-efficient
# SDPA kernel on sm80 and later (DefaultGemmType<float> in its mem_eff_attention/gemm_kernel_utils.h). Each operand
# x is split into two tf32 parts, big + small, which leaves |x - big - small| <= 2^-22 |x|, and the small x small
# product is dropped: each product q_d k_d is off by up to 3 * 2^-22 = 6 eps(fp32) of its size before any add
# rounds, unbiased, 0.63 eps rms (tests/test_tolerance_tf32x3.py emulates it). A logit, their sum, is then off by up
# to six of those standard deviations times L (the sum of its terms' sizes), TF32X3_SPLIT, beyond the adds' random
# walk. On an H100 the kernel's fp32 LSE read 1.04-1.38x the bound without it, 0.28-0.38x with it (21 cases of a
# campaign, d 8 and 16, sq 396-725).
TF32X3 = ("sdpa-efficient",)
TF32X3_SPLIT = 4.0
# Families whose logits are a matmul rounded to the input dtype, as a textbook implementation's are: TE's unfused
# backend (baddbmm in fp16 / bf16). Their logits carry eps(dtype) * L, not eps(fp32) * L: on bf16 logits of ~100 a
# row's own naive baseline, which rounds them differently, can land low by chance (te-unfused on an H200: 1.2-1.6x
# over, read as SCALE, without it).
LOGITS_IN_INPUT_DTYPE = ("te-unfused",)
# Families whose fp16 / bf16 backward pass is fused the way FlashAttention's is: fp32 accumulators, and only P (before
# dV = P^T dO) and dS (before dQ = dS K, dK = dS^T Q) rounded to the dtype besides the inputs and dO. Their gradients
# are graded against a baseline computed so (oracles/reference.py, `rounding`) with per-row floors (oracles/grade.py,
# gradient_check), not against the textbook backward in the dtype, whose every product and sum rounds: that one is
# ~2 % off on a bf16 row, and k = 4 of it let a row off by 5 % pass. `fused` is a bring-your-own kernel that declares
# it computes so or more precisely (fuzz/backends/custom.py), such as bench/planted.py's fp32 kernels. A family joins
# once correct kernels of it pass this grading on its devices (bench/grad_calibration.py). SDPA's have, on the CPU
# (sdpa-math, which upcasts fp16 / bf16 to fp32, and sdpa-flash: no failure in 2 x 3,000 drawn cases, the worst
# gradient at 0.94 of its bound) and on an H100 (sdpa-flash, sdpa-efficient, sdpa-cudnn: no failure in ~120 short
# and ~150 long-row cases each, the worst at 0.43, but cuDNN's known bug on rows that see no key). Their ALiBi stays
# textbook: SDPA takes it as a bias in the input dtype (BIAS_IN_INPUT_DTYPE), a rounding the fused baseline does not
# make (gradients.fused_backward). FA4 and TE's fused and flash backends (te: cuDNN's fused attention and FA4 under
# TE's API) have too, on an H100: 45 long-row runs, then 40 short and long-row runs, none failed but at a known
# bug's record, the worst gradient at 0.27 of its bound (docs/grading.md). Their FP8 backward (te-fused-fp8) is not
# calibrated and keeps the textbook baseline with its FP8 allowance. FA2 and FA3 wait for a long-row calibration;
# te-unfused computes in the input dtype (baddbmm in bf16, autograd through it) and stays textbook, as do custom,
# flex, flashinfer and default (context-parallel merges).
FUSED_BACKWARD = ("fused", "sdpa", "sdpa-efficient", "sdpa-cudnn", "fa4", "te", "te-fused")
# Families whose backward rounds dS to the dtype with the softmax scale already folded in (scale * P (dP - D)), then
# takes dQ = dS K and dK = dS^T Q without it: cuDNN's fused attention (TE's fused backend and torch's cuDNN SDPA) and
# torch's memory-efficient kernel. In fp16 a small dS * scale sits among the subnormals, whose absolute spacing 2^-24
# is then 1 / scale times what FlashAttention's rounding of dS (the scale applied after the sum) gives
# (gradients.subnormal_allowance). On an H100, fp16, keys tied so that a dQ channel is exactly 0 and dS * scale
# ~ 1e-5: TE's fused and torch's cuDNN dQ there were 8.34e-7 (1.35x the unscaled allowance), the efficient kernel's
# 9.54e-7 (1.54x), FA4's 0; that rounding written out (tests/fused_kernels.py, `scaled_ds`) matched 89 % of cuDNN's
# dQ and 91 % of its dK to the bit (FlashAttention's order 15 % and 16 %), 54 % and 60 % of the efficient kernel's
# (15 %, 16 %), and FA4's the other way round (15 %, 16 % against 83 %, 91 %).
SCALED_DS_ROUNDING = ("sdpa-cudnn", "sdpa-efficient", "te-fused")
# Families whose LSE sums P as its P V matmul takes it, rounded to the input dtype: FlashInfer's prefill kernels take
# a row's denominator from P cast to fp16 / bf16 through an MMA with a ones vector (m16k16_rowsum_f16f16f32 in its
# prefill.cuh), so log(d) carries P's rounding (up to 2^-11 in fp16, 2^-8 in bf16) where an fp32 row sum carries
# none. Their LSE baseline rounds P so too (oracles/reference.py, `rowsum`): on an H200 FlashInfer's fp16 LSE was
# 1.5e-4 off at LSEs of 0.25, 2.3 and 19 (1.1-1.2x the fp32 baseline's bound), whatever the scale's rounding.
ROWSUM_OF_ROUNDED_P = ("flashinfer",)

# A softcap's tanh taken with a fast approximation: PTX's tanh.approx.f32, which FlashInfer takes, has a relative
# error of up to 2^-10.99, so each capped logit may be off by cap * 2^-11 (FlashInfer on an H200: prefill with cap
# 0.5, an LSE 7.9e-4 off, 5.6x over without it; decode with cap 30, 1.4x over). The documented bound, not a measured
# one: a softcap case's bounds are that much looser.
FAST_TANH = 2.0**-11


# The value families (strategies/materialize.py) whose dot products one term dominates by construction: an outlier
# channel, a row's logit shift (far_negative, large_sink: sdpa-math fp32, d = 128, a row shifted by -128 seeing two
# keys was 1.4x over without it) and anti-aligned keys (2^14).
DOMINATED = ("outlier_channel", "far_negative", "large_sink", "anti_aligned")


def dominated_dot(case) -> int:
    """d_qk where one term dominates every dot product by construction (DOMINATED), else 0: Gaussian terms keep
    their partial sums ~sqrt(d) below L, and a sqrt(d) allowance there would hide a 4x LSE error at d = 64
    (tests/test_tolerance_calibration.py)."""
    return case.d_qk if case.values in DOMINATED else 0


def dot_ulps(dot_terms: int, dtype: str) -> float:
    """How many ulps of its size L a logit may be off by, where one of its `dot_terms` products dominates it."""
    # A logit is a dot product of `dot_terms` (d_qk) terms summed in fp32: each add rounds at the size of its partial
    # sum, a random walk of ~sqrt(d) / 2 ulps of the largest partial sum, which is L itself when one term dominates
    # (an outlier channel: sdpa-flash bf16, d = 128, one +-65536 product in each dot: its LSE was 5.1 eps * L off,
    # where 2 eps * L was allowed). Gaussian terms keep their partial sums ~sqrt(d) below L, so up to d = 16 this
    # stays eps * L, the allowance before; only cases built so (dominated_dot) pass d here. fp16 / bf16 logits come
    # from tensor cores, whose fp32 accumulation truncates at each k-step of 16 products (Fasi et al., "Numerical
    # behavior of NVIDIA tensor cores", PeerJ CS 7:e330, 2021): errors of one sign that add, an ulp of the partial
    # sum a step, d / 16 ulps in all (sdpa-efficient fp16 on an H100, d = 512, one outlier channel: its LSE 32.6 ulps
    # of a 65607 logit off, where the walk allowed 2 x 11.3; bench/dominated_dot.py measures a kernel's).
    truncated_steps = dot_terms / 16 if dtype in LOW_PRECISION else 0.0
    return max(1.0, dot_terms ** 0.5 / 2, truncated_steps)


def rounded_rowsum_lse(family: str, dtype: str, rest_rms: torch.Tensor | None, rest_mass: torch.Tensor | None):
    """What a correct LSE of a ROWSUM_OF_ROUNDED_P family may be off by, per row, beyond its baseline: the kernel
    rounds each P_ij = exp(s_ij - m) to the dtype (relative error up to u = eps / 2) against its running maximum m,
    not the final one the baseline rounds against, so its rounding errors are not the baseline's. The row's largest
    weight is exact (exp(0)); the others move d = sum_j P_ij by u * sum_j P_ij delta_j, so log d by about
    P_ROUNDING_SIGMAS standard deviations of that (u / sqrt(3) * sqrt(sum_j P_ij^2)) and never by more than
    u * sum_j P_ij (weights normalised by d; the reference's row_rest_rms and row_rest_mass). On an H100 FlashInfer's
    prefill kernels read 1.08-2.64x over the bound without it (bf16 LSEs 2e-4 to 4e-4 off, fp16 1.9e-4); a kernel
    emulated so reads up to 2.4x without it and passes with it (tests/test_rowsum_lse.py)."""
    if family not in ROWSUM_OF_ROUNDED_P or dtype not in LOW_PRECISION or rest_rms is None or rest_mass is None:
        return 0.0
    u = EPS[dtype] / 2
    return u * torch.minimum(P_ROUNDING_SIGMAS * UNIFORM_SD * rest_rms, rest_mass).to(torch.float64)


def k_for(family: str, quantity: str, dtype: str) -> float:
    table = K.get(family, {}).get(quantity, {})
    return table.get(dtype, K["default"][quantity][dtype])


@dataclass(frozen=True)
class Check:
    """One quantity graded: at its worst row (largest error over bound), the row's error, baseline, floor and worst
    element. `row` is the worst row's index (all dims but the channel), `rows` how many rows were graded."""

    name: str
    diff_max: float
    baseline_max: float
    k: float
    floor: float
    index: tuple[int, ...]
    got: float
    expected: float
    rows: int = 1
    row_bounds: torch.Tensor | None = field(default=None, compare=False, repr=False)  # every row's bound (inf: ungraded)
    # the baseline was not computed (check's floor_first: every row's error is within its floor, so the bound holds
    # whatever the baseline): baseline_max reads 0, the bound the floor, the ratio an upper bound of the full one
    within_floor: bool = False

    @property
    def bound(self) -> float:
        return self.k * self.baseline_max + self.floor

    @property
    def ok(self) -> bool:
        return self.diff_max <= self.bound

    @property
    def ratio(self) -> float:
        return self.diff_max / self.bound if self.bound > 0 else (0.0 if self.diff_max == 0 else float("inf"))

    def describe(self) -> str:
        baseline = "not needed (within the floor)" if self.within_floor else f"{self.baseline_max:.3e}"
        return (f"{self.name}: worst of {self.rows} rows at {list(self.index)}: diff_max={self.diff_max:.3e} "
                f"baseline_max={baseline} k={self.k:g} floor={self.floor:.3e} (ratio {self.ratio:.2f}): "
                f"got={self.got:.6g} expected={self.expected:.6g}")


def _unravel(flat: int, shape) -> tuple[int, ...]:
    """The index of element `flat` of a row-major tensor of `shape` (torch.unravel_index, without its tensors)."""
    index = []
    for size in reversed(tuple(shape)):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def _per_row(x: torch.Tensor, rowwise: bool) -> torch.Tensor:
    return x.amax(-1) if rowwise else x


Lazy = Callable[[], torch.Tensor]


def check(name: str, got: torch.Tensor, ref: torch.Tensor, naive: torch.Tensor | Lazy | None, where: torch.Tensor, *,
          family: str, quantity: str, dtype: str, logit_size: float | torch.Tensor = 0.0,
          spread: torch.Tensor | None = None, scale_of_terms: float = 0.0, inherited: float = 0.0,
          bias_max: float = 0.0, baseline: torch.Tensor | Lazy | None = None, keys: int = 0,
          row_terms: float | torch.Tensor = 0.0, rms: torch.Tensor | None = None, dot_terms: int = 0,
          softcap: float | None = None, final_eps: float | None = None, floor_first: bool = False,
          quantised: float | torch.Tensor = 0.0) -> Check:
    """Grade `got` against the float64 `ref`, row by row, at the elements `where` (bool, broadcast to got's shape);
    elements outside `where` are not graded. A row is all dims but the last for out / dq / dk / dv, one element for
    the LSE. Non-finite values count as infinite error. `logit_size` is a float or a per-row tensor (the shape of
    the rows); `spread` (per row) bounds the terms an output row sums (see the module's docstring).
    `scale_of_terms` bounds the terms that sum to the value in the kernel's compute precision, where they can
    cancel: a gradient that is 0 in exact arithmetic comes out as fp32 rounding noise of the size of its terms, not
    of its own size. `inherited` is an absolute error a correct kernel carries in from a rounded input (a
    gradient's from D). `baseline` replaces |naive - ref| (the diagnoses grade against an alternative reference
    with the baseline of the case's own). `final_eps` replaces how many eps(dtype) of the row's largest value its
    final rounding is allowed (1 for an output row, 2 for a gradient row). `naive` and `baseline` may be functions
    that compute them. `floor_first`: where every graded row's error is within its floor, the row passes whatever
    its baseline, which is then not computed (the Check is `within_floor`, its bound the floor); the verdict is the
    same either way, and building the naive baseline is a third of the oracle's work on a small case. `quantised`
    (per row) is what a correct kernel's rounding of P may move a row by, added to the floor: an FP8 kernel's output
    row (oracles/fp8.py, with its FP8 output's rounding), or the LSE of a kernel that sums P rounded
    (rounded_rowsum_lse)."""
    rowwise = quantity != "lse"
    got64, ref64 = got.to(torch.float64), ref.to(torch.float64)
    where = where.expand_as(ref64)
    zero = torch.zeros((), dtype=torch.float64, device=ref64.device)
    # a non-finite element of got differs by inf or NaN from any ref (inf - inf is NaN): both read as inf
    diff = torch.where(where, (got64 - ref64).abs().nan_to_num(nan=float("inf"), posinf=float("inf")), zero)
    mag_r = _per_row(torch.where(where, ref64.abs().nan_to_num(nan=0.0, posinf=0.0), zero), rowwise)
    diff_r = _per_row(diff, rowwise)
    graded_r = where.any(-1) if rowwise else where
    logit_eps = EPS["float64"] if dtype == "float64" else EPS["float32"]
    # Where ALiBi can only reach the kernel as a bias tensor in the input dtype (SDPA's additive float mask), each
    # logit carries that bias's rounding in the dtype too: the API's error, not the kernel's.
    size = logit_size.to(torch.float64) if isinstance(logit_size, torch.Tensor) else logit_size
    dot_walk = dot_ulps(dot_terms, dtype) + (TF32X3_SPLIT if dtype == "float32" and family in TF32X3 else 0.0)
    logit_round = max(logit_eps, EPS[dtype]) if family in LOGITS_IN_INPUT_DTYPE else logit_eps
    logit_err = (logit_round * size * dot_walk + (EPS[dtype] * bias_max if family in BIAS_IN_INPUT_DTYPE else 0.0)
                 + (FAST_TANH * softcap if softcap else 0.0))
    if quantity == "lse":  # absolute: exp(lse + e) = exp(lse) * (1 + e); kernels keep it in fp32
        fast_exp = FAST_EXP if dtype in LOW_PRECISION else 0.0
        compute_eps = logit_eps if dtype in LOW_PRECISION else EPS[dtype]
        # the row sum of `keys` terms, added in the kernel's order: in a sequential sum of n similar terms each add
        # rounds by up to eps / 2 of the running sum, uniformly, so the sum is off by eps * sqrt(n) / 6 relative at
        # one standard deviation; eps * sqrt(n) is six of them, and blocked sums are closer (sdpa-efficient fp32 on
        # an H100, one query over 37,632 near-uniform keys: its LSE 3.8e-6 off, 1.41x the bound without this)
        rowsum_walk = compute_eps * keys ** 0.5
        floor = fast_exp + 2 * compute_eps * mag_r.clamp(min=1.0) + rowsum_walk + 2 * logit_err + 1e-7 + quantised
    else:
        moved = spread.to(torch.float64) if spread is not None else mag_r
        # the fast exp's relative error moves the weights like a logit error does, an output row by at most
        # 2 e spread_i; a share common to the row's weights cancels in the normalisation, and what is left varies
        # with each logit's fraction, so it moves the row like P's rounding below does, by P_ROUNDING_SIGMAS
        # standard deviations (the spread, which assumed every key's error conspires, was 10x a correct fp16
        # kernel's error on a row of 1024 keys and hid one leaked key on it)
        fast_exp = FAST_EXP if dtype in LOW_PRECISION and spread is not None else 0.0
        p_sd = P_ROUNDING_SIGMAS * UNIFORM_SD * rms.to(torch.float64) if rms is not None else None
        if fast_exp and p_sd is not None:
            fast_exp_floor = 2 * fast_exp * torch.minimum(p_sd, spread.to(torch.float64))
        else:
            fast_exp_floor = 2 * fast_exp * moved
        weight_err = logit_err
        # P V summed over up to `keys` terms in the compute precision: blocked sums err ~sqrt(n) ulps of the terms
        # (a row's own naive baseline can be exact by luck: sdpa-math fp32 read 1 +- 3 ulps for a probe row of 26
        # keys summing to exactly 1, whose fp32 naive was exact)
        weight_err = weight_err + (2 + keys ** 0.5) * logit_eps / 2
        # fp16 / bf16 backward passes round P to the dtype before dV = P^T dO (FlashAttention's and torch's math
        # backward do): each term carries eps / 2, and a key row's sum moves by that times its own terms
        # (`row_terms`, sum_i P_ij |dO_i|). The whole-tensor bound hid it behind the worst row's baseline; a row's
        # own baseline can land low (sdpa-math fp16 dV of a probe case, d_v = 1: 1.9x over without it).
        if dtype in LOW_PRECISION:
            floor_terms = EPS[dtype] * row_terms
        else:
            floor_terms = 0.0
        # The same rounding of P before O = P V: eps / 2 on each term P_ij V_j, with signs that do not conspire, so a
        # row moves by about eps / 2 * sqrt(sum_j (P_ij V_j)^2) (`rms`) times a few standard deviations, and never
        # by more than eps / 2 * sum_j P_ij |V_j| (`spread`). A row's own naive baseline rounds P too, but its error
        # can land low by chance when the row sums few terms (sdpa-flash bf16 on an H200, 2 keys whose values cancel
        # to an output of 0.02: 1.14x over without it). On a long row it stays far below one key's weight, 1 / n.
        if dtype in LOW_PRECISION and p_sd is not None and spread is not None:
            floor_terms = floor_terms + EPS[dtype] / 2 * torch.minimum(p_sd, spread.to(torch.float64))
        # The final rounding of a correct value to the dtype, u = eps / 2 of the row's largest element, twice (the
        # kernel's and once to spare) for an output row; gradients keep four times, for their two more matmuls.
        if final_eps is None:
            final_eps = 1.0 if quantity == "out" else 2.0
        final = final_eps * EPS[dtype] * mag_r
        floor = (floor_terms + fast_exp_floor + final + 2 * weight_err * moved + (8 * logit_eps + 2 * float(
            logit_err.max() if isinstance(logit_err, torch.Tensor) and logit_err.numel() else logit_err))
            * scale_of_terms + 2 * inherited + 1e-7)
        floor = floor + quantised
    k = k_for(family, quantity, dtype)
    floor = torch.as_tensor(floor, dtype=torch.float64, device=ref64.device).expand_as(diff_r)
    within_floor = floor_first and bool(torch.where(graded_r, diff_r <= floor, True).all())
    if within_floor:
        base_r = torch.zeros_like(diff_r)
    else:
        baseline = baseline() if callable(baseline) else baseline
        if baseline is None:
            naive = naive() if callable(naive) else naive
            baseline = (naive.to(torch.float64) - ref64).abs().nan_to_num(nan=0.0, posinf=0.0)
        base_r = _per_row(torch.where(where, baseline, zero), rowwise)
    bound_r = k * base_r + floor
    # no error is a ratio of 0 whatever the bound; an error over a bound of 0 is inf, and so is inf over inf
    ratio_r = torch.where(diff_r == 0, 0.0, diff_r / bound_r)
    ratio_r = torch.where(graded_r, ratio_r.nan_to_num(nan=float("inf")), -1.0)
    if not diff.numel():
        return Check(name, 0.0, 0.0, k, 0.0, (), 0.0, 0.0, 0)
    worst = int(torch.argmax(ratio_r).item())
    row = _unravel(worst, ratio_r.shape)
    index = row + ((int(torch.argmax(diff[row]).item()),) if rowwise else ())
    # the worst row's figures read in one transfer (each .item() is a dispatch, and a sync on a GPU)
    diff_max, baseline_max, floor_max, got_v, expected_v, rows = torch.stack(
        [diff_r[row], base_r[row], floor[row], got64[index], ref64[index], graded_r.sum().to(torch.float64)]).tolist()
    return Check(name=name, diff_max=diff_max, baseline_max=baseline_max, k=k, floor=floor_max, index=index,
                 got=got_v, expected=expected_v, rows=int(rows), row_bounds=torch.where(graded_r, bound_r, float("inf")),
                 within_floor=within_floor)
