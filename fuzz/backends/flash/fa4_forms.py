"""FA4's argument forms: other values of one argument that flash_attn.cute.interface (4.0.0b36) reads as the
attention the adapter's own call asks for. Each is a spelling on its own, with the default mask spelling.

  explicit_scale  softmax_scale=1/sqrt(d_qk) for a case with the default scale (the adapter passes None, which
                  _flash_attn_fwd and _flash_attn_bwd replace by 1.0 / math.sqrt(head_dim)); the same kernel
  softcap_none    softcap=None for a case without softcap (the adapter passes 0.0). flash_attn_func types softcap as
                  a float with default 0.0, but _flash_attn_fwd's own default is None and it turns 0.0 into None, so
                  None is the forward's "no cap"; _flash_attn_bwd tests `softcap != 0.0`, which None passes: with
                  gradients it builds the softcap score_mod from None (a different backward, expected to fail)
  no_lse          return_lse=False: the output (and gradients) graded alone. Without gradients _flash_attn_fwd
                  allocates no LSE and compiles the kernel that writes none (`lse is None` is in its compile key);
                  with gradients it still computes and returns one, which this spelling does not grade
  sink_qdtype     learnable_sink in q's dtype instead of float32 (_LEARNABLE_SINK_DTYPES takes float16, bfloat16,
                  float32; the sink's dtype is in the compile key), where every sink value is exact in that dtype:
                  off-by-one (zeros) and the learnable "large_sink" family (+-100, +-1000)
  no_max_seqlen   flash_attn_varlen_func calls only: max_seqlen_q=None, max_seqlen_k=None, the signature's defaults
                  (_flash_attn_fwd takes total_q, and the page-table row or k's length; the tiling is read off them)
  max_seqlen_tensor  the same calls: max_seqlen_q / max_seqlen_k as 0-d int32 tensors on q's device, the form
                  _flash_attn_fwd and _flash_attn_bwd test with torch.is_tensor ("e.g. HF/TE varlen"): host-side
                  hints dropped, another scheduler choice (is_static_persistent) in the compile key
"""

from __future__ import annotations

import torch

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

FORMS = ("explicit_scale", "softcap_none", "no_lse", "sink_qdtype", "no_max_seqlen", "max_seqlen_tensor")


def form_spellings(case: Case, *, varlen: bool) -> tuple[str, ...]:
    """The forms that mean the case's attention (the module's docstring says where each applies); `varlen`: the
    default spelling goes through flash_attn_varlen_func, which takes max_seqlen_q / max_seqlen_k."""
    valid = {"explicit_scale": case.scale is None, "softcap_none": case.softcap is None, "no_lse": True,
             "sink_qdtype": exact_sink(case), "no_max_seqlen": varlen, "max_seqlen_tensor": varlen}
    return tuple(name for name in FORMS if valid[name])


def exact_sink(case: Case) -> bool:
    """Whether every sink value the case draws is exact in float16 and bfloat16 (materialize: zeros for
    off-by-one, +-100 / +-1000 for a learnable sink of the large_sink family)."""
    return case.softmax == "off_by_one" or (case.softmax == "learnable" and case.values == "large_sink")


def form_kwargs(case: Case, spelling: str, t: Tensors) -> dict:
    """The arguments a form replaces in the adapter's call ({} for any other spelling)."""
    if spelling == "explicit_scale":
        return {"softmax_scale": case.softmax_scale}
    if spelling == "softcap_none":
        return {"softcap": None}
    if spelling == "no_lse":
        return {"return_lse": False}
    if spelling == "sink_qdtype":
        sink = t.sink.to(getattr(torch, case.dtype))
        if not torch.equal(sink.float(), t.sink.float()):
            raise ValueError(f"sink_qdtype on a case whose sinks are not exact in {case.dtype}: {t.sink.tolist()}")
        return {"learnable_sink": sink}
    if spelling == "no_max_seqlen":
        return {"max_seqlen_q": None, "max_seqlen_k": None}
    if spelling == "max_seqlen_tensor":
        return {name: torch.tensor(n, dtype=torch.int32, device=t.q.device)
                for name, n in (("max_seqlen_q", case.sq), ("max_seqlen_k", case.skv))}
    return {}


def kernel_key(case: Case, spelling: str) -> tuple:
    """What a form changes in FA4's compiled kernels: whether the forward writes an LSE, the sink's dtype, whether
    the backward builds a softcap score_mod, max_seqlen as tensors. explicit_scale compiles nothing new (the scale
    is a runtime value), nor does no_max_seqlen beyond what the lengths already choose."""
    writes_lse = spelling != "no_lse" or case.grads
    sink = case.dtype if spelling == "sink_qdtype" else ("float32" if case.softmax != "vanilla" else None)
    bwd_softcap = case.grads and (case.softcap is not None or spelling == "softcap_none")
    return writes_lse, sink, bwd_softcap, spelling == "max_seqlen_tensor"
