"""flash-attn 3's FP8 forward (fa3-fp8): flash_attn_func / flash_attn_varlen_func with q, k and v as FP8 encodings and
their descales, a backend of its own that draws FP8 cases only (the plain fa3 stream keeps its cases).

What FA3 3.0.0 takes (hopper/, read from flash_attn_interface.py and flash_api_stable.cpp; docs/backends.md cites
each place):
- q, k and v in one dtype, torch.float8_e4m3fn (mha_fwd: "FlashAttention only supports fp16, bf16, and fp8_e4m3 data
  type"; k and v must have q's dtype): no float8_e5m2, no FP8 KV cache under a 16-bit q. Head dims are multiples of
  16 for FP8 (`alignment`), at most 256.
- q_descale, k_descale, v_descale: float32 [batch, num_heads_k] each (CHECK_SHAPE; q's too is per KV head, "(b, h_k),
  not (b, h)"). The mainloop multiplies the softmax scale by q_descale * k_descale and the output by v_descale.
- The output is BF16 whatever the case (out_type); no FP8 output. P is rounded to e4m3 before P V
  (convert_type_out into the Element type), at a scale of 2^8: the softmax subtracts its row maximum less
  Max_offset = 8 (flash_fwd_kernel_sm90.h, softmax.h), so P <= 256 when it is rounded: the case's fp8_p = "e4m3".
- Forward only: the backward takes fp16 / bf16.
A case's descale is what the encoding is multiplied by (strategies/fp8.py), exactly FA3's descale; per-tensor
descales become [b, hk] of one value, per-head ones [b, hk] of each KV head's (q's only where h == hk: with GQA a
query head's own descale has no place in FA3's call).
"""

from __future__ import annotations

import dataclasses

import torch

from attnfuzz.backends.base import Unsupported
from attnfuzz.backends.flash import fa3
from attnfuzz.backends.flash.repro import flash_source
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.fp8 import FP8Inputs
from attnfuzz.strategies.materialize import Tensors
from attnfuzz.strategies.space import Space, narrow_to
from attnfuzz.strategies.cases import attention_cases

FORMAT = "e4m3"
OUT_DTYPE = "bfloat16"
HEAD_DIM_MULTIPLE = 16


def fp8_refusals(case: Case) -> list[tuple[bool, str]]:
    """What FA3's FP8 forward refuses of a case: (refused, reason) rows, first match wins."""
    fp8 = case.fp8 or (None, None, None)
    dims = (case.d_qk, case.d_v)
    return [
        (case.fp8 is None, "takes FP8 cases only (fp8=('e4m3',) * 3); the plain fa3 backend takes the others"),
        (fp8[0] is None, f"fp8={fp8!r}: FA3 takes q in k's and v's dtype (mha_fwd: \"query and key must have the "
                         f"same dtype\"): no FP8 KV cache under a 16-bit q"),
        (any(f != FORMAT for f in fp8), f"fp8={fp8!r}: FA3 takes float8_e4m3fn only (\"FlashAttention only supports "
                                        f"fp16, bf16, and fp8_e4m3 data type\")"),
        (case.fp8_out is not None, f"fp8_out={case.fp8_out!r}: FA3's FP8 forward returns BF16 (mha_fwd's out_type)"),
        (case.fp8_p != FORMAT, f"fp8_p={case.fp8_p!r}: FA3 rounds P to e4m3 before P V (fp8_p='e4m3')"),
        (case.dtype != OUT_DTYPE, f"dtype {case.dtype}: FA3's FP8 forward returns {OUT_DTYPE}, the case's output dtype"),
        (case.fp8_scaling == "page", "fp8_scaling='page': FA3's descales are per (batch, KV head), not per page"),
        (case.fp8_scaling == "head" and case.h != case.hk,
         f"fp8_scaling='head' with h={case.h}, hk={case.hk}: FA3's q_descale is per (batch, KV head), so the query "
         f"heads of a group share one, and the case has one per query head"),
        (case.page_size is not None, "paged KV cache: fa3-fp8 passes no page_table"),
        (case.layout == "sbhd", "layout sbhd: the FP8 encodings are handed over batched [b, s, h, d] or packed (thd)"),
        (any(d % HEAD_DIM_MULTIPLE for d in dims),
         f"head dims {dims}: FA3's FP8 forward needs multiples of {HEAD_DIM_MULTIPLE} (mha_fwd's alignment)"),
    ]


def descales(case: Case, f: FP8Inputs) -> dict[str, torch.Tensor]:
    """q_descale, k_descale, v_descale as FA3 takes them: float32 [b, hk], contiguous. q's is its first query head's
    descale of each group (the refusals keep only cases where a group's are equal)."""
    group = case.h // case.hk
    per_kv = {"q_descale": f.q_descale.reshape(case.hk, group)[:, 0], "k_descale": f.k_descale,
              "v_descale": f.v_descale}
    return {name: d.to(torch.float32)[None, :].expand(case.b, case.hk).contiguous() for name, d in per_kv.items()}


# The repro script's encodings: its q, k, v are the dequantised values (exact), divided back by the call's descales
ENCODE = ("q, k, v = ((x.float() / d.to(x.device).repeat_interleave(x.shape[2] // d.shape[1], dim=1)[:, None, :, None])"
          ".to(torch.float8_e4m3fn) for x, d in ((q, Q_DESCALE), (k, K_DESCALE), (v, V_DESCALE)))"
          "  # the e4m3 encodings (exact)")


class FlashAttn3FP8(fa3.FlashAttn3):
    name = "fa3-fp8"
    serves_fp8 = True

    def available(self) -> str | None:
        reason = super().available()
        if reason is None and fa3.build_flags().get("FLASHATTENTION_DISABLE_FP8"):
            return "this FA3 build has no FP8 kernels (FLASHATTENTION_DISABLE_FP8); rebuild with FP8=1"
        return reason

    def refusals(self, case: Case) -> list[tuple[bool, str]]:
        return fp8_refusals(case) + fa3.capability_refusals(case)

    def fitted(self, case: Case) -> Case:
        """A drawn FP8 case moved to what FA3 takes by construction: e4m3 throughout, P rounded to e4m3, a BF16
        output, per-tensor scales where GQA leaves a query head's own descale no place, and unpaged (no case drawn
        for fa3-fp8 is paged; narrow_to probes the scalings with a page size)."""
        if case.fp8 is None:
            return case
        scaling = "tensor" if case.fp8_scaling == "head" and case.h != case.hk else case.fp8_scaling
        paged = {} if case.fp8_scaling == "page" else dict(page_size=None, shared_prefix_pages=0)
        return case.replace(fp8=(FORMAT,) * 3, fp8_p=FORMAT, fp8_out=None, dtype=OUT_DTYPE, fp8_scaling=scaling,
                            **paged)

    def cases(self, space: Space | None = None):
        """`space` narrowed to what FA3's FP8 forward takes, each case fitted: drawing the formats, outputs and
        dtypes it refuses outright would leave most draws UNSUPPORTED."""
        space = narrow_to(space or Space(fp8=True), lambda c: self.unsupported(self.fitted(c)))
        return attention_cases(space).map(self.fitted)

    def call_kwargs(self, case: Case, t: Tensors) -> dict:
        return {**super().call_kwargs(case, t), **descales(case, t.fp8)}

    def run(self, case: Case, tensors: Tensors) -> Output:
        if tensors.fp8 is None:
            raise Unsupported("fa3-fp8 needs the case's FP8 encodings (an FP8 case)")
        f = tensors.fp8
        return super().run(case, dataclasses.replace(tensors, q=f.q8, k=f.k8, v=f.v8))

    def repro_source(self, case: Case) -> str | None:
        return flash_source(self, case, module=self.api, library=self.library, positional_varlen=True,
                            prelude=(ENCODE,))


BACKENDS = {"fa3-fp8": FlashAttn3FP8}
