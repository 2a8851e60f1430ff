"""torch's ring attention (the function torch.distributed.tensor.experimental.context_parallel wraps), one engine
per KV rotate method, on CPU (gloo) or CUDA (NCCL) alike.

On CPU with gloo the public `context_parallel` API fails for causal SDPA, so the engine calls the ring function it
wraps, `_templated_ring_attention`, with the SDPA op that returns an LSE on the rank's device: the CPU flash op on
CPU; on CUDA the flash op for fp16/bf16 and the memory-efficient op for fp32 (the flash op takes no fp32).

Spellings (case.spelling): "head_tail" runs with torch's load balancing on (shards head-tail, causal only),
"contiguous" with it off; "" is torch's default (on for causal, off otherwise, since torch refuses load balancing
for non-causal attention). Both spellings must agree with the oracle.

fp32 on CUDA: the memory-efficient op pads its LSE to a multiple of 32 rows and torch's ring merge does not cut the
padding off (fuzz/backends/cp/capabilities.py, RING_LSE_PADDING_WHY); a shard that runs into it is reported as that torch
defect by name rather than as a gather error, and cp_cases draws fp32 CUDA lengths clear of it.

GQA: the CPU flash op takes grouped KV heads itself (query head i reads KV head i // (h / hk)), so on CPU the ring
rotates the hk KV heads as they are. The CUDA ops refuse grouped heads, so there the engine repeats KV head j for
query heads j*g..(j+1)*g-1 before the ring and sums dK / dV over each group after it (written in `ran`).
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass

import torch

from attnfuzz.backends.base import Unsupported
from attnfuzz.backends.cp.capabilities import LSE_ALIGN, RING_LSE_PADDING, ring_lse_padding_defect, ring_refusal
from attnfuzz.backends.cp.engine import CPEngine, LocalInputs, RankContext, RankOutput
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

ROTATES = ("allgather", "alltoall")
RING_MODULES = ("torch.distributed.tensor.experimental._context_parallel._attention",
                "torch.distributed.tensor.experimental._attention")
RING_NAMES = ("_templated_ring_attention", "_templated_ring_attention_backward", "_cp_options", "_RotateMethod")


def ring_module():
    """The torch module holding the ring functions (its path moved between torch releases)."""
    for name in RING_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if all(hasattr(mod, attr) for attr in RING_NAMES):
            return mod
    raise Unsupported(f"torch {torch.__version__} has no ring attention functions {RING_NAMES} in {RING_MODULES}")


@contextlib.contextmanager
def ring_options(mod, rotate: str, load_balance: bool):
    """torch keeps the rotate method and load balancing in one module-level options object; set both for the
    duration of one call and put the old values back."""
    opts = mod._cp_options
    old = (opts.rotate_method, opts.enable_load_balance)
    opts.rotate_method = mod._RotateMethod.ALL_GATHER if rotate == "allgather" else mod._RotateMethod.ALL_TO_ALL
    opts.enable_load_balance = load_balance
    try:
        yield
    finally:
        opts.rotate_method, opts.enable_load_balance = old


@dataclass(frozen=True)
class SdpaOps:
    """One SDPA forward/backward pair as the ring calls them: fwd(q, k, v, is_causal=, **fwd_kwargs) ->
    (out, lse, *rest); bwd(**{grad_out_name: dout}, query=, key=, value=, out=, logsumexp=, is_causal=, ...)."""

    name: str
    fwd: object
    bwd: object
    grad_out_name: str
    lse_align: int = 1  # the op pads its LSE to a multiple of this many rows

    def fwd_kwargs(self, scale: float) -> dict:
        if self.name == "flash_cpu":
            return {"dropout_p": 0.0, "scale": scale}
        if self.name == "flash":
            return {"dropout_p": 0.0, "return_debug_mask": False, "scale": scale}
        return {"attn_bias": None, "compute_log_sumexp": True, "dropout_p": 0.0, "scale": scale}

    def bwd_kwargs(self, scale: float, rest: tuple) -> dict:
        if self.name == "flash_cpu":
            return {"dropout_p": 0.0, "scale": scale}
        if self.name == "flash":
            cum_q, cum_k, max_q, max_k, seed, offset = rest[:6]
            return {"cum_seq_q": cum_q, "cum_seq_k": cum_k, "max_q": max_q, "max_k": max_k, "dropout_p": 0.0,
                    "philox_seed": seed, "philox_offset": offset, "scale": scale}
        seed, offset = rest[:2]
        return {"attn_bias": None, "philox_seed": seed, "philox_offset": offset, "dropout_p": 0.0,
                "grad_input_mask": [True, True, True, False], "scale": scale}


def sdpa_ops(device: torch.device, dtype: torch.dtype) -> SdpaOps:
    aten = torch.ops.aten
    if device.type == "cpu":
        return SdpaOps("flash_cpu", aten._scaled_dot_product_flash_attention_for_cpu.default,
                       aten._scaled_dot_product_flash_attention_for_cpu_backward.default, "grad_out")
    if dtype in (torch.float16, torch.bfloat16):
        return SdpaOps("flash", aten._scaled_dot_product_flash_attention.default,
                       aten._scaled_dot_product_flash_attention_backward.default, "grad_out")
    if dtype == torch.float32:
        return SdpaOps("efficient", aten._scaled_dot_product_efficient_attention.default,
                       aten._scaled_dot_product_efficient_attention_backward.default, "grad_out_", LSE_ALIGN)
    raise Unsupported(f"ring attention on CUDA: no SDPA op with an LSE takes dtype {dtype}")


def expands_kv(case: Case, device: torch.device) -> bool:
    """Whether the adapter repeats KV heads itself (CUDA SDPA ops take no grouped heads; the CPU op does)."""
    return device.type == "cuda" and case.h != case.hk


def to_heads_major(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, expand: bool):
    """[b, s, heads, d] -> [b, heads, s, d]; with `expand`, KV heads repeated so query head i reads KV head
    i // (h // hk)."""
    g = case.h // case.hk
    if expand and g > 1:
        k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def grouped_kv_grad(case: Case, grad: torch.Tensor) -> torch.Tensor:
    """[b, h, s, d] gradient of the repeated KV heads -> [b, s, hk, d], summed over each group."""
    b, h, s, d = grad.shape
    return grad.transpose(1, 2).reshape(b, s, case.hk, h // case.hk, d).sum(3)


@dataclass(frozen=True)
class RingEngine(CPEngine):
    """torch ring attention with KV rotated by `rotate` ("allgather" or "alltoall") over `world` ranks."""

    rotate: str = "allgather"
    world: int = 2
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.rotate not in ROTATES:
            raise ValueError(f"RingEngine: rotate={self.rotate!r} is not one of {ROTATES}")

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"ring-{self.rotate}"

    def load_balanced(self, case: Case) -> bool:
        return case.spelling == "head_tail" or (case.spelling == "" and case.causal)

    def convention(self, case: Case) -> str:
        return "head_tail" if self.load_balanced(case) else "contiguous"

    def unsupported(self, case: Case) -> str | None:
        return ring_refusal(case, self.world, self.device)

    def sdpa(self, device: torch.device, dtype: torch.dtype) -> SdpaOps:
        """The SDPA op pair the ring calls on this device and dtype."""
        return sdpa_ops(device, dtype)

    def _describe(self, case: Case, ops: SdpaOps, expand: bool) -> str:
        lb = "on" if self.load_balanced(case) else "off"
        gqa = f", KV heads repeated x{case.h // case.hk} by the adapter" if expand else ""
        return f"{self.name}(world={self.world}, load_balance={lb}, op={ops.name}{gqa})"

    def run_rank(self, ctx: RankContext, case: Case, local: LocalInputs) -> RankOutput:
        reason = self.unsupported(case)
        if reason:
            raise Unsupported(reason)
        mod = ring_module()
        expand = expands_kv(case, ctx.device)
        q, k, v = to_heads_major(case, local.q, local.k, local.v, expand)
        ops = self.sdpa(q.device, q.dtype)
        scale = case.softmax_scale
        defect = ring_lse_padding_defect(case, self.world, ops.lse_align)
        with ring_options(mod, self.rotate, self.load_balanced(case)):
            try:
                out, lse, *rest = mod._templated_ring_attention(ctx.group, 2, ops.fwd, q, k, v,
                                                                is_causal=case.causal, **ops.fwd_kwargs(scale))
            except RuntimeError as e:
                if defect:
                    raise RuntimeError(f"{RING_LSE_PADDING} ({q.shape[2]} query rows on this rank): {e}") from e
                raise
            if out.shape[2] != q.shape[2]:
                raise RuntimeError(f"{RING_LSE_PADDING if defect else 'torch ring attention'}: it returned "
                                   f"{out.shape[2]} query rows for a shard of {q.shape[2]}")
            grads = None
            if case.grads:
                dout = local.dout.transpose(1, 2).contiguous()
                grads = mod._templated_ring_attention_backward(
                    ctx.group, 2, ops.bwd, dout, ops.grad_out_name, q, k.contiguous(), v.contiguous(), out, lse,
                    case.causal, **ops.bwd_kwargs(scale, tuple(rest)))
        result = RankOutput(out=out.transpose(1, 2), lse=lse[..., :q.shape[2]], ran=self._describe(case, ops, expand))
        if grads is not None:
            dk, dv = grads[1], grads[2]
            result.dq = grads[0].transpose(1, 2)
            result.dk = grouped_kv_grad(case, dk) if expand else dk.transpose(1, 2)
            result.dv = grouped_kv_grad(case, dv) if expand else dv.transpose(1, 2)
        return result

    def run_whole(self, ctx: RankContext, case: Case, tensors: Tensors) -> RankOutput:
        """The same SDPA op on the whole sequence, no ring: the non-CP side of the second signal."""
        q, k, v = to_heads_major(case, tensors.q, tensors.k, tensors.v, expands_kv(case, ctx.device))
        ops = self.sdpa(q.device, q.dtype)
        out, lse, *_ = ops.fwd(q, k, v, is_causal=case.causal, **ops.fwd_kwargs(case.softmax_scale))
        return RankOutput(out=out.transpose(1, 2), lse=lse[..., :q.shape[2]], ran=f"{ops.name} without ring")
