"""The translation of an FP8 KV cache case for FlashInfer's paged wrappers, whose FP8 backends (flashinfer/adapter.py)
are backends of their own (they draw FP8 cases only, so the plain flashinfer-paged-* streams keep theirs):

    flashinfer-paged-prefill-fp8kv   BatchPrefillWithPagedKVCacheWrapper   q in fp16 / bf16, K / V pages in FP8
    flashinfer-paged-decode-fp8kv    BatchDecodeWithPagedKVCacheWrapper    the same, one query per sequence

What FlashInfer 0.7.2.post1 takes (read from its Python sources; docs/backends.md cites each place):
- The pool holds the FP8 encodings, dtype torch.float8_e4m3fn or torch.float8_e5m2, and plan(kv_data_type=) names
  that dtype; run() checks k_cache's dtype against it (utils._check_cached_qkv_data_type), so K and V share one
  format. q stays in q_data_type, fp16 or bf16: the fa2 kernels have no FP8 q ("fp8 tensor core is not supported in
  fa2 backend"), and the output is in q's dtype (fa2 / fa3 have no FP8 output).
- run(k_scale=, v_scale=) are one float each per call: run() multiplies sm_scale by k_scale before the kernel and
  the output by v_scale after it. The LSE is of the logits scaled by sm_scale * k_scale: the real logits.
- A case's descale is what the encoding is multiplied by (strategies/fp8.py), exactly FlashInfer's k_scale /
  v_scale; q's descale is 1 (q unquantised), so no q_scale is passed.
Refused: FP8 q, an FP8 output, P quantised, per-head or per-page scales, K and V in different formats.
"""

from __future__ import annotations

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors


def fp8_refusals(case: Case) -> list[tuple[bool, str]]:
    """What the paged wrappers refuse of an FP8 case: (refused, reason) rows, first match wins."""
    fp8 = case.fp8 or (None, None, None)
    return [
        (case.fp8 is None, "takes FP8 KV caches only (fp8=(None, k, v)); the plain flashinfer-paged-* backends take "
                           "the other cases"),
        (fp8[0] is not None, f"fp8[0]={fp8[0]!r}: FP8 q has no fa2 kernel (\"fp8 tensor core is not supported in fa2 "
                             f"backend\"); FlashInfer's FP8 KV caches take q in fp16 / bf16"),
        (fp8[1] != fp8[2], f"fp8={fp8!r}: one kv_data_type for K and V (run() checks k_cache's dtype only)"),
        (case.fp8_out is not None, f"fp8_out={case.fp8_out!r}: fa2 / fa3 have no FP8 output (\"FP8 output is not "
                                   f"supported in fa2/fa3 backends yet\"); the output is in q's dtype"),
        (case.fp8_p is not None, f"fp8_p={case.fp8_p!r}: FlashInfer dequantises K and V and keeps P in q's dtype"),
        (case.fp8_scaling != "tensor", f"fp8_scaling={case.fp8_scaling!r}: FlashInfer's paged wrappers take one "
                                       f"k_scale / v_scale float per call"),
    ]


def as_kv_cache(case: Case) -> Case:
    """The case as an FP8 KV cache: q in the dtype, V in K's format (a non-FP8 case unchanged)."""
    if case.fp8 is None:
        return case
    return case.replace(fp8=(None, case.fp8[1], case.fp8[1]))


def scales(t: Tensors) -> dict:
    """run()'s k_scale / v_scale: the case's per-tensor descales as Python floats (exact: float32 in a double)."""
    return {"k_scale": float(t.fp8.k_descale[0]), "v_scale": float(t.fp8.v_descale[0])}
