"""te-fused-fp8: TransformerEngine's FP8 dot-product attention (DotProductAttention on FusedAttention, cuDNN's FP8
SDPA), handed the case's FP8 encodings and descales as they are. A backend of its own (FP8 cases only), so the plain
te-* streams keep theirs. What TE 2.20.2 takes (docs/backends.md cites each place):

- FP8 attention is on inside te.autocast(enabled=True, recipe=DelayedScaling(fp8_dpa=True)); on sm90 FusedAttention
  runs no other FP8 recipe (current scaling and MXFP8 are sm100+), and TE disables FlashAttention (FA2 / FA4) and the
  unfused backend for FP8 attention.
- q, k, v as Float8Tensor(data=encodings, fp8_scale_inv=descale, fp8_dtype=kFloat8E4M3): FusedAttention takes them
  as they are (no requantisation) and hands each one's scale_inv to cuDNN as descale_q / descale_k / descale_v, one
  float per tensor. DelayedScaling asserts "Pure E5M2 training is not supported": the forward format is e4m3.
- cuDNN quantises P times scale_s to e4m3 and multiplies P V by 1 / scale_s; scale_s is the S quantizer's scale,
  fp8_meta["scaling_fwd"].scale[META_S], set here to the case's p_scale. It writes O in e4m3 times scale_o =
  scale[META_O], set to 1 / out_descale. TE returns O dequantised into the dtype, or with fp8_output=True as a
  Float8Tensor whose encodings the adapter dequantises with the case's out_descale.
- On sm90: inference head dims up to 256 in multiples of 16 (128 with the backward); mask types no_mask / causal /
  padding / padding_causal (top-left; no bottom-right causal); no sliding window and no sink softmax (sm100+ with
  cuDNN 9.21); bshd / sbhd.
- The backward (FusedAttnFunc.backward, NVTE_FP8_DPA_BWD on by default): a Float8Tensor dO is taken as it is (its
  scale_inv is cuDNN's descale_dO); P is rounded with the forward's scale_s; dS with the dP quantizer's scale
  (scaling_bwd.scale[META_DP], the case's ds_scale); dQ, dK, dV with the one dQKV quantizer's (scale[META_DQKV]) and
  returned as Float8Tensors (FP8 inputs, bf16_backward off). All three are e5m2 under HYBRID, e4m3 under E4M3. One
  dQKV scale per run: where the case's dQ / dK / dV descales differ, the adapter runs once per distinct descale.
  The backward runs inside the autocast: its exit with grad mode on re-derives the forward scales from their amaxes.

Spellings: "" (O dequantised by TE), "fp8-output" (O as FP8 encodings), "e4m3-format" (Format.E4M3: the forward is
the same e4m3), "padding" (a padding mask type over full lengths), "forward-args" (mask type in forward()).
"""

from __future__ import annotations

import importlib
import warnings

import torch

from attnfuzz.backends import fp8_contract
from attnfuzz.backends.base import Unsupported, first_reason
from attnfuzz.backends.te import selection as sel
from attnfuzz.backends.te.adapter import LIBRARY, TransformerEngineAttention, _logical_out
from attnfuzz.backends.te.call import band_kind, te_call
from attnfuzz.backends.te.repro import fp8_source
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.fp8 import TORCH_FP8
from attnfuzz.strategies.materialize import TORCH_DTYPES, Tensors, materialize
from attnfuzz.strategies.space import Space, narrow_to

RECIPE_MODULE = f"{LIBRARY}.common.recipe"
FUSED_ATTN_MODULE = f"{LIBRARY}.pytorch.cpp_extensions.fused_attn"   # META_*: the scale slots of S, O, dO, dP, dQKV
SPELLINGS = ("", "fp8-output", "e4m3-format", "padding", "forward-args")
MAX_HEAD_DIM = {90: 256, 100: 128}   # cuDNN's FP8 forward on sm90 (inference) / sm100+, multiples of 16
MAX_TRAINING_HEAD_DIM = 128          # with the backward, sm90 and sm100+


class NotFP8(sel.BackendMismatch):
    """DotProductAttention ran without FP8 attention on: the run proves nothing about TE's FP8 path."""


def top_left(case: Case) -> bool:
    """Whether the case's causal band is the top-left one: aligned so, or every sequence with queries as long as its
    keys (both alignments agree)."""
    return case.alignment == "top_left" or all(q == kv for q, kv in zip(case.lens_q, case.lens_kv) if q)


def fp8_refusals(case: Case, arch: int) -> list[tuple[bool, str]]:
    """What TE 2.20.2's FP8 attention refuses on a GPU of compute capability `arch` (10 * major + minor), as (refused,
    reason) rows, first match wins. Rules that depend on the cuDNN version are left to TE at run time."""
    fp8 = case.fp8 or (None, None, None)
    kind = band_kind(case)
    hopper = arch < 100
    largest = MAX_TRAINING_HEAD_DIM if case.grads else MAX_HEAD_DIM[90 if hopper else 100]
    return [
        (case.fp8 is None, "takes FP8 cases only (q, k and v as FP8 encodings); te-fused takes the others"),
        (fp8[0] is None, "fp8[0]=None (q in the dtype): TE's FP8 attention takes q, k and v all in FP8 (cuDNN's FP8 "
                         "graph types Q, K and V alike)"),
        ("e5m2" in fp8, f"fp8={fp8!r}: the forward format is e4m3 (DelayedScaling asserts 'Pure E5M2 training is not "
                        f"supported'; HYBRID and E4M3 quantise the forward in e4m3)"),
        (case.fp8_out != "e4m3", f"fp8_out={case.fp8_out!r}: under DelayedScaling cuDNN writes O in e4m3 (an output "
                                 f"kept in the dtype is Float8CurrentScaling's, sm100+ only)"),
        (case.fp8_p != "e4m3", f"fp8_p={case.fp8_p!r}: cuDNN's FP8 SDPA always quantises P to e4m3 (the S quantizer)"),
        (case.fp8_scaling != "tensor", f"fp8_scaling={case.fp8_scaling!r}: a Float8Tensor has one scale_inv, cuDNN "
                                       f"one descale per q, k, v and dO, TE one dQKV scale"),
        *backward_refusals(case),
        (case.dtype not in ("float16", "bfloat16"), f"dtype {case.dtype}: the FP8 tensors' nominal dtype (the "
                                                    f"output's) is float16 or bfloat16"),
        (case.layout == "thd", "thd: cuDNN's FP8 attention takes bshd / sbhd ('FP8 fused attention only supports "
                               "qkv_format=BSHD, SBHD, or BHSD')"),
        (case.paged, "paged KV cache: TE disables FusedAttention for FP8 KV caching"),
        (case.mask_density is not None, "explicit boolean mask: FP8 FusedAttention takes no 'arbitrary' mask type"),
        (case.alibi_slopes is not None, "ALiBi: 'FP8 fused attention does not support ALiBi yet!'"),
        (case.softcap is not None, "softcap: TE's FusedAttention does not support it"),
        (hopper and case.softmax != "vanilla", f"softmax={case.softmax}: TE disables FP8 FusedAttention for sink "
                                               f"softmax on sm < 100 (and cuDNN < 9.21)"),
        (hopper and (kind == "window" or (kind == "causal" and case.left is not None)),
         f"window {case.window}: TE disables FP8 FusedAttention for sliding windows on sm < 100 (and cuDNN < 9.21)"),
        (hopper and kind == "causal" and not top_left(case),
         "bottom-right causal with queries shorter or longer than keys: cuDNN's FP8 backend on sm90 has top-left "
         "causal masks only"),
        (max(case.d_qk, case.d_v) > largest or case.d_qk % 16 or case.d_v % 16,
         f"head dims ({case.d_qk}, {case.d_v}): cuDNN's FP8 {'backward' if case.grads else 'forward'} takes "
         f"multiples of 16 up to {largest} here"),
    ]


def backward_format(spelling: str) -> str:
    """dO's, dS's and dQ / dK / dV's format: the recipe's backward one (get_fp8_te_dtype), e5m2 under HYBRID."""
    return "e4m3" if spelling == "e4m3-format" else "e5m2"


def backward_refusals(case: Case) -> list[tuple[bool, str]]:
    """The FP8 backward's fields TE takes under the spelling's format: one format for dO, dS and dQ / dK / dV."""
    fmt = backward_format(case.spelling)
    recipe = "E4M3" if fmt == "e4m3" else "HYBRID"
    return [
        (case.grads and case.fp8_dout != fmt, f"fp8_dout={case.fp8_dout!r}: TE's dO quantizer under {recipe} is {fmt} "
                                              f"(spelling {case.spelling!r})"),
        (case.grads and case.fp8_ds != fmt, f"fp8_ds={case.fp8_ds!r}: cuDNN rounds dS to dO's format ({fmt}) with TE's "
                                            f"dP quantizer"),
        (case.grads and case.fp8_dqkv != fmt, f"fp8_dqkv={case.fp8_dqkv!r}: under DelayedScaling TE's dQKV quantizer "
                                              f"rounds dQ, dK, dV to {fmt} (bf16_backward only dequantises them after)"),
    ]


def applicable_spellings(case: Case) -> tuple[str, ...]:
    """The FP8 spellings that express the case ("padding" only where it has no padding of its own; with gradients,
    those whose backward format is dO's)."""
    return tuple(s for s in SPELLINGS if (s != "padding" or not case.padded)
                 and (not case.grads or backward_format(s) == case.fp8_dout))


def recipe_of(case: Case, recipe_module):
    """DelayedScaling with FP8 attention on, in the spelling's format (HYBRID, or E4M3)."""
    fmt = recipe_module.Format.E4M3 if case.spelling == "e4m3-format" else recipe_module.Format.HYBRID
    return recipe_module.DelayedScaling(fp8_format=fmt, fp8_dpa=True)


def fp8_call(case: Case, t: Tensors) -> tuple[dict, dict]:
    """(DotProductAttention kwargs, forward kwargs but the inputs) for the case: te_call's, with a top-left causal
    band spelled "causal" (the one causal type sm90's FP8 backend has) and fp8_output for that spelling."""
    mask_spelling = case.spelling if case.spelling in ("padding", "forward-args") else ""
    aligned = case.replace(alignment="top_left") if band_kind(case) == "causal" and top_left(case) else case
    init, _, kwargs = te_call(aligned.replace(spelling=mask_spelling), t, sel.FUSED)
    kwargs["fp8_output"] = case.spelling == "fp8-output"
    return init, kwargs


def encodings(case: Case, t: Tensors) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """q, k, v: (the FP8 encodings in the case's layout, contiguous, as uint8; the descale, float32 [1])."""
    out = {}
    for name in ("q", "k", "v"):
        x8 = getattr(t.fp8, f"{name}8")
        x8 = x8.transpose(0, 1) if case.layout == "sbhd" else x8
        out[name] = (x8.contiguous().view(torch.uint8), getattr(t.fp8, f"{name}_descale")[:1].float().clone())
    return out


def scales(t: Tensors) -> tuple[float, float]:
    """(scale_s, scale_o): P's scale (the case's p_scale) and O's (1 / out_descale), as TE's S and O quantizers hold
    them."""
    return float(t.fp8.p_scale), 1.0 / float(t.fp8.out_descale)


def backward_scales(meta: torch.Tensor, fused, t: Tensors, dqkv_descale: float) -> None:
    """scaling_bwd's dO, dP (dS) and dQKV slots: 1 / dO's descale (the quantizer a Float8Tensor dO bypasses),
    ds_scale, and 1 / the dQ / dK / dV descale."""
    meta[fused.META_DO] = 1.0 / float(t.fp8.dout_descale[0])
    meta[fused.META_DP] = float(t.fp8.ds_scale)
    meta[fused.META_DQKV] = 1.0 / dqkv_descale


def grad_output(te, case: Case, t: Tensors, out):
    """dO as TE's output is shaped ([b, s, h*d_v] / [s, b, h*d_v]): a Float8Tensor of the case's encodings (e5m2 /
    e4m3) and descale, which TE hands cuDNN as it is."""
    x8 = t.fp8.dout8.transpose(0, 1) if case.layout == "sbhd" else t.fp8.dout8
    data = x8.contiguous().view(torch.uint8).reshape(out.shape).to(out.device)
    fmt = te.DType.kFloat8E4M3 if case.fp8_dout == "e4m3" else te.DType.kFloat8E5M2
    return te.Float8Tensor(shape=data.shape, dtype=TORCH_DTYPES[case.dtype], data=data,
                           fp8_scale_inv=t.fp8.dout_descale[:1].float().clone().to(out.device), fp8_dtype=fmt,
                           requires_grad=False, device=data.device)


def gradient_encodings(case: Case, g) -> torch.Tensor:
    """A Float8Tensor gradient's encodings in the case's [b, s, heads, d] as its torch FP8 dtype."""
    x = g._data.view(TORCH_FP8[case.fp8_dqkv])
    return x.transpose(0, 1) if case.layout == "sbhd" else x


def _check_fp8(dpa, when: str) -> None:
    """NotFP8 unless the module has FP8 attention on (its fp8 flag and its recipe's fp8_dpa)."""
    recipe = dpa.fp8_meta.get("recipe")
    if not (dpa.fp8 and recipe is not None and recipe.fp8_dpa):
        raise NotFP8(f"{when} without FP8 attention (DotProductAttention.fp8={dpa.fp8}, recipe {recipe!r}): TE did "
                     f"not take the FP8 autocast")


class TEFusedFP8(TransformerEngineAttention):
    """te-fused-fp8: DotProductAttention forced onto FusedAttention under FP8 attention, fed Float8Tensors."""

    serves_fp8 = True
    fp8_backward = True

    def __init__(self, device: str = "cuda") -> None:
        super().__init__("te-fused-fp8", sel.FUSED, device)

    def available(self) -> str | None:
        missing = super().available()
        if missing is None and self.arch < 90:
            return f"TE's FP8 fused attention needs sm90+ (this GPU is sm{self.arch})"
        return missing

    def unsupported(self, case: Case) -> str | None:
        known = applicable_spellings(case)
        return first_reason(*fp8_refusals(case, self.arch),
                            (case.spelling not in known, f"spelling={case.spelling!r} is not one of {self.name}'s "
                                                         f"spellings here: {list(known)}"))

    def spellings(self, case: Case) -> tuple[str, ...]:
        return applicable_spellings(case)

    @staticmethod
    def fitted(case: Case) -> Case:
        """A probe moved to what TE's FP8 path always has: output and P in e4m3 (the space's only choices for them),
        and with gradients dS and dQ / dK / dV in dO's format under the spelling whose backward format that is."""
        if case.fp8 is None:
            return case
        case = case.replace(fp8_out=case.fp8_out or "e4m3", fp8_p=case.fp8_p or "e4m3")
        if not (case.grads and case.fp8_dout):
            return case
        spelling = "e4m3-format" if case.fp8_dout == "e4m3" else case.spelling
        return TEFusedFP8.one_backward_format(case).replace(spelling=spelling)

    @staticmethod
    def one_backward_format(case: Case) -> Case:
        """A drawn case with dS and dQ / dK / dV in dO's format (TE's recipe has one backward format)."""
        return case.replace(fp8_ds=case.fp8_dout, fp8_dqkv=case.fp8_dout) if case.grads and case.fp8_dout else case

    def cases(self, space: Space | None = None):
        """`space` narrowed to TE's FP8 attention: e4m3 q, k, v, output and P, per-tensor scales, no paged caches;
        with gradients one backward format for dO, dS and dQ / dK / dV."""
        space = (space or Space()).replace(fp8=True, fp8_formats=("e4m3",), fp8_plain_q=False, fp8_outputs=("e4m3",),
                                           fp8_ps=("e4m3",), fp8_scalings=("tensor",), paged=False)
        return attention_cases(narrow_to(space, lambda c: self.unsupported(self.fitted(c)))).map(
            self.one_backward_format)

    def _attempt(self, case: Case, tensors: Tensors, dqkv_descale: float | None):
        """One forward (and, given dQ / dK / dV's descale, backward) through TE: (out, [dq, dk, dv] or None, ran)."""
        te = self._te()
        recipes, fused = importlib.import_module(RECIPE_MODULE), importlib.import_module(FUSED_ATTN_MODULE)
        init, kwargs = fp8_call(case, tensors)
        grads = dqkv_descale is not None
        q, k, v = (te.Float8Tensor(shape=data.shape, dtype=TORCH_DTYPES[case.dtype], data=data, fp8_scale_inv=d,
                                   fp8_dtype=te.DType.kFloat8E4M3, requires_grad=grads, device=data.device)
                   for data, d in encodings(case, tensors).values())
        scale_s, scale_o = scales(tensors)
        with (sel.forced_backend(self.te_backend), warnings.catch_warnings(),
              torch.enable_grad() if grads else torch.no_grad()):
            warnings.filterwarnings("ignore", message="window_size should be")
            dpa = te.DotProductAttention(**init)
            dpa.train(grads)
            with te.autocast(enabled=True, recipe=recipe_of(case, recipes)), sel.watched(dpa) as selection:
                dpa.init_fp8_metadata(num_gemms=3)   # the scales exist from here; set them for this call
                _check_fp8(dpa, "before the call")
                meta = dpa.fp8_meta["scaling_fwd"].scale
                meta[fused.META_S], meta[fused.META_O] = scale_s, scale_o
                if grads:
                    backward_scales(dpa.fp8_meta["scaling_bwd"].scale, fused, tensors, dqkv_descale)
                out = sel.called(self.te_backend, selection, lambda: dpa(q, k, v, **kwargs))
                # inside the autocast: its exit (grad mode on) moves the forward scales the backward reads
                dx = torch.autograd.grad(out, (q, k, v), grad_output(te, case, tensors, out)) if grads else None
            ran = sel.check_ran(self.te_backend, selection)
            _check_fp8(dpa, f"{ran} ran")
        return out, dx, ran

    def run(self, case: Case, tensors: Tensors) -> Output:
        reason = self.unsupported(case)
        if reason:
            raise Unsupported(reason)
        if not case.grads:
            out, _, ran = self._attempt(case, tensors, None)
            grads = [None] * 3
        else:   # TE's one dQKV scale: a run per distinct descale among dQ's, dK's and dV's
            wanted = [float(getattr(tensors.fp8, f"d{x}_descale")[0]) for x in "qkv"]
            grads = [None] * 3
            for d in dict.fromkeys(wanted):
                out, dx, ran = self._attempt(case, tensors, d)
                for i, want in enumerate(wanted):
                    grads[i] = gradient_encodings(case, dx[i]) if want == d else grads[i]
            grads = fp8_contract.dequantised_grads(case, tensors, grads)
        if case.spelling == "fp8-output":   # the e4m3 encodings, dequantised with the case's own descale
            out = out._data.view(torch.float8_e4m3fn).float() * tensors.fp8.out_descale.to(out._data.device)
        return Output(out=_logical_out(case, out).detach(), lse=None, dq=grads[0], dk=grads[1], dv=grads[2],
                      ran=f"{ran}, FP8 (DelayedScaling)")

    def repro_source(self, case: Case) -> str | None:
        """The standalone forward (te/repro.py fp8_source) for a case this backend takes without gradients, else
        None."""
        if self.unsupported(case) is not None or case.grads:
            return None
        t = materialize(case, "cpu")
        init, kwargs = fp8_call(case, t)
        scale_s, scale_o = scales(t)
        named = {f"{name.upper()}_DESCALE": (d, f"{name}'s descale: {name} = encoding * descale")
                 for name, (_, d) in encodings(case, t).items()}
        named.update(P_SCALE=(scale_s, "scale_s: cuDNN quantises P * P_SCALE to e4m3"),
                     O_SCALE=(scale_o, "scale_o: cuDNN encodes O * O_SCALE in e4m3"))
        if kwargs["fp8_output"]:
            named["OUT_DESCALE"] = (float(t.fp8.out_descale), "the output's descale: O = encoding * OUT_DESCALE")
        return fp8_source(self, case, init, kwargs, named)

    def compile_key(self, case: Case) -> tuple | None:
        return None


BACKENDS = {"te-fused-fp8": TEFusedFP8}
