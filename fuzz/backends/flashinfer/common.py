"""What the FlashInfer adapters share: the capability table, the case's band in FlashInfer's terms, the paged KV
metadata (kv_indptr / kv_indices / kv_last_page_len) from the block table, and the LSE back in natural log.

Written against FlashInfer 0.7.2's documented Python API (flashinfer.prefill / flashinfer.decode); no run of these
adapters has been graded on a GPU yet. FlashInfer's conventions, as documented and as the adapters translate them:
- Bands are aligned bottom-right (query i of qo_len sees keys up to i + kv_len - qo_len when causal);
  `window_left` (-1 = unbounded) bounds the left side only, so a right bound other than None or 0 (causal) has no
  spelling. A top-left case goes through flash-attn's shift (backends/flash/common.bottom_right_band).
- `logits_soft_cap` caps the scaled logits, cap * tanh(x / cap); `sm_scale` defaults to 1/sqrt(head_dim).
- The LSE comes back in base 2 (log2 of the softmax denominator), [total_q, h]; the adapters multiply by ln 2.
- A paged cache is CSR: sequence n's pages are kv_indices[kv_indptr[n]:kv_indptr[n + 1]], its last page holds
  kv_last_page_len[n] keys, 1 <= kv_last_page_len <= page_size: an empty cache has no spelling.
- kv_layout "NHD" pages are [num_pages, page_size, hk, d], "HND" [num_pages, hk, page_size, d]: a spelling
  (flashinfer/spelling.py lists them all).
- Kernels of the "trtllm-gen" (and cubin-backed "cudnn") backends download prebuilt cubins at run time: they cannot
  work offline and are refused (the adapters ask for backend="fa2", the JIT / AOT FlashAttention-2 path).
"""

from __future__ import annotations

import math

import torch

from attnfuzz.backends.base import Unsupported
from attnfuzz.backends.flash.common import bottom_right_band
from attnfuzz.backends.layout import cu_seqlens, lse_from_packed
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.paged import PagedKV

MODULE = "flashinfer"
VERSION = "0.7.2"
DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128, 256)
KERNEL_BACKEND = "fa2"
CUBIN_BACKENDS = ("trtllm-gen", "cudnn")
WORKSPACE_BYTES = 128 * 1024 * 1024
REFUSAL_WORDS = ("not supported", "Unsupported", "does not support", "only support", "must be")


def band(case: Case) -> tuple[tuple | None, str | None]:
    """(causal, window_left) of the call, or (None, why FlashInfer cannot express the case's band)."""
    bounds, reason = bottom_right_band(case)
    if bounds is None:
        return None, f"FlashInfer aligns bands bottom-right, as flash-attn does: {reason}"
    left, right = bounds
    if right not in (None, 0):
        return None, (f"right bound {right}: FlashInfer bounds the right side only through causal (right = 0); "
                      f"window_left is its one window bound")
    return (right == 0, -1 if left is None else left), None


def capability_refusals(case: Case) -> list[tuple[bool, str]]:
    """What every FlashInfer entry point refuses: (refused, reason) rows, first match wins."""
    _, band_reason = band(case)
    return [
        (case.dtype not in DTYPES, f"dtype {case.dtype}: FlashInfer's attention takes {' / '.join(DTYPES)} "
                                   f"(FP8 KV caches: flashinfer-paged-*-fp8kv)"),
        (case.d_qk != case.d_v, f"d_qk={case.d_qk} != d_v={case.d_v}: these entry points take one head_dim"),
        (case.d_qk not in HEAD_DIMS, f"head dim {case.d_qk}: FlashInfer's prebuilt kernels take {HEAD_DIMS}"),
        (case.grads, "FlashInfer's serving kernels are forward-only: no gradients"),
        (case.mask_density is not None, "explicit boolean mask: custom_mask / packed_custom_mask is not spelled "
                                        "by these adapters"),
        (case.softmax != "vanilla", f"softmax={case.softmax}: attention sinks exist only in FlashInfer's "
                                    f"trtllm-gen kernels, which fetch cubins at run time"),
        (case.alibi_slopes is not None, "ALiBi: FlashInfer's pos_encoding_mode='ALIBI' derives its own slopes and "
                                        "adds a signed distance; the case's slopes have no spelling"),
        (band_reason is not None, band_reason or ""),
    ]


def cubin_refusal(kernel_backend: str) -> str | None:
    if kernel_backend in CUBIN_BACKENDS:
        return (f"FlashInfer backend={kernel_backend!r} downloads prebuilt cubins at run time, which cannot work "
                f"offline; use backend='fa2'")
    return None


def paged_metadata(paged: PagedKV) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(kv_indptr [b + 1], kv_indices [total pages], kv_last_page_len [b]), int32, from the block table."""
    device = paged.block_table.device
    ps = paged.page_size
    indptr = torch.tensor([0, *torch.tensor(paged.pages).cumsum(0).tolist()], dtype=torch.int32, device=device)
    indices = torch.cat([paged.block_table[n, :count] for n, count in enumerate(paged.pages)])
    last = [int(length) - (count - 1) * ps for length, count in zip(paged.cache_seqlens.tolist(), paged.pages)]
    return indptr, indices.to(torch.int32), torch.tensor(last, dtype=torch.int32, device=device)


def kv_pages(paged: PagedKV, kv_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool as the kv_layout holds it: NHD as built, HND with pages [hk, page_size, d]."""
    if kv_layout == "HND":
        return paged.k_cache.transpose(1, 2).contiguous(), paged.v_cache.transpose(1, 2).contiguous()
    return paged.k_cache, paged.v_cache


def qo_indptr(case: Case, device) -> torch.Tensor:
    return cu_seqlens(case.lens_q, device)


def natural_lse(lse: torch.Tensor | None, case: Case) -> torch.Tensor | None:
    """FlashInfer's base-2 LSE [total_q, h] (packed by qo_indptr) as the natural-log [b, h, sq] float32; an LSE of
    another shape comes back as it came, in natural log, for the grader to report as SHAPE."""
    if lse is None:
        return None
    if lse.dim() != 2 or lse.shape[1] != case.h:
        return lse.detach().float() * math.log(2)
    return lse_from_packed(lse.detach().float().transpose(0, 1) * math.log(2), case.lens_q, case.sq)


def refusal(exc: BaseException) -> Unsupported | None:
    """An Unsupported for FlashInfer's own input check naming an unsupported feature; None for anything else."""
    message = str(exc)
    if isinstance(exc, NotImplementedError) or any(w in message for w in REFUSAL_WORDS):
        return Unsupported(f"FlashInfer refused the case: {message.strip() or type(exc).__name__}")
    return None
