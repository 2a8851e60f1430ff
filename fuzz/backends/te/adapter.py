"""TransformerEngine DotProductAttention (read from TE 2.20.2), forced onto one backend per adapter: te-flash
(FlashAttention, FA4 on the GPU runner), te-fused (FusedAttention, cuDNN), te-unfused (UnfusedDotProductAttention).

TE spells a mask as attn_mask_type + window_size (-1 = unbounded) + bottom_right_diagonal: "causal" is top-left and
"causal_bottom_right" bottom-right; windows follow bottom_right_diagonal (forced False for "causal" /
"padding_causal"); padding comes as cu_seqlens or as boolean attention_mask tensors (True = masked out); "arbitrary"
takes a dense mask. check_set_window_size() rewrites "no_mask" + (-1, 0) to (-1, -1) with only a warning, so that is
not an equivalent spelling of causal and is not listed. The module returns no LSE. Each run is checked to have used
the backend asked for (fuzz/backends/te/selection.py).

Inputs go to TE as the case lays them out, strided views included (DotProductAttention allows non-contiguous inputs):
what TE does with them is graded, not avoided. TE-side findings, left in the fuzzed space on
purpose: FusedAttention reads head-major views as
bshd (get_qkv_layout checks only k against v, cuDNN strides come from the layout name); the unfused backend turns
"no window" (-1, -1) into the finite window (skv, sq), which hides keys when the diagonal is top-left and sq != skv;
unfused thd crashes when no query token is left.
"""

from __future__ import annotations

import importlib
import warnings

import torch

from attnfuzz.backends.flash import common as fc
from attnfuzz.backends.te import selection as sel
from attnfuzz.backends.te.call import MASK_TYPE_ALIASES, band_kind, flash_call, is_cross, te_call, te_mask
from attnfuzz.backends.te.repro import te_source
from attnfuzz.backends.flash.fa4 import DEFAULT_ARCH, head_dim_reason as fa4_head_dim_reason
from attnfuzz.backends.base import Backend, Unsupported, first_reason
from attnfuzz.backends.layout import unpack
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

LIBRARY = "transformer_engine"


def import_te():
    """transformer_engine.pytorch. On the H200 runner TE loads the system's cuDNN: imported in a process where torch
    has already loaded its own cuDNN (torch.backends.cudnn, an SDPA cuDNN call), the mix fails with `undefined symbol`
    in libcudnn_heuristic. The error then says to give TE a process of its own. FA4's disk cache is turned on as
    for fa4: TE's FlashAttention is FA4 on the runner."""
    from attnfuzz.backends.flash.fa4 import use_disk_cache
    use_disk_cache()
    try:
        return importlib.import_module(f"{LIBRARY}.pytorch")
    except OSError as e:
        if "libcudnn" not in str(e):
            raise
        raise ImportError(f"{e}: TE's cuDNN clashes with the one torch loaded earlier in this process; run TE "
                          f"backends in a process of their own (--isolate, or an `attnfuzz run` of their own)") from None


def te_version() -> str:
    """TE's version: the imported module's, else its package metadata's (without loading its libraries)."""
    import sys
    from importlib import metadata
    if LIBRARY in sys.modules:
        return str(getattr(sys.modules[LIBRARY], "__version__", ""))
    for dist in ("transformer_engine", "transformer-engine"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


DTYPES = {sel.FLASH: ("float16", "bfloat16"), sel.FUSED: ("float16", "bfloat16"),
          sel.UNFUSED: ("float16", "bfloat16", "float32")}
SPELLINGS = ("", "window", "explicit-window", "unbounded-window", "wide", "padding", "attention_mask",
             "comma-mask-type", "causal-padding", "no-max-seqlen", "cross", "forward-args", "arbitrary")


def applicable_spellings(case: Case, backend: str) -> tuple[str, ...]:
    """The TE spellings that express this case ("" is the default) and that `backend` can take:
    window / explicit-window / wide   causal as no_mask + (left, 0); causal + (-1, 0); unbounded sides as wide bounds
    unbounded-window                  window_size (-1, -1) for a full band or a causal one unbounded on the left
                                      (check_set_window_size turns it into (-1, 0) for causal types, with a warning)
    padding / attention_mask          a padding mask type with full-length cu_seqlens / the padding as boolean
                                      attention_mask tensors (bshd / sbhd; TE derives cu_seqlens from them)
    comma-mask-type / causal-padding  the mask type as 'padding,causal' (and the like) / 'causal,padding'
    no-max-seqlen                     thd without max_seqlen_q / max_seqlen_kv (TE rounds the longest up to 64)
    cross / forward-args / arbitrary  attention_type "cross"; mask arguments in forward(); the band as a dense mask"""
    kind = band_kind(case)
    if kind == "arbitrary":
        return ("",)
    names = [""]
    if kind == "causal":
        names += ["window", "explicit-window", "unbounded-window"] if case.left is None else ["window"]
    if kind == "full":
        names.append("unbounded-window")
    if None in (case.left, case.right):
        names.append("wide")
    if case.layout != "thd" and not case.padded:
        names.append("padding")
    if case.layout != "thd":
        names.append("attention_mask")
    mask_type, _ = te_mask(case.replace(spelling=""))
    names += [s for s in MASK_TYPE_ALIASES if mask_type in MASK_TYPE_ALIASES[s]]
    if case.layout == "thd":
        names.append("no-max-seqlen")
    if not is_cross(case):
        names.append("cross")
    names.append("forward-args")
    if backend == sel.UNFUSED and case.layout != "thd":
        names.append("arbitrary")
    return tuple(names)


def capability_refusals(case: Case, backend: str, flash_major: str | None = None,
                        arch: int = DEFAULT_ARCH) -> list[tuple[bool, str]]:
    """What TE 2.20.2's get_attention_backend() rules out for `backend`, as (refused, reason) rows. Rules that depend
    on the cuDNN version are left to TE itself: its refusal at run time becomes Unsupported with TE's logged reason.
    `flash_major` is the flash-attn major TE loaded, when known; `arch` the GPU's compute capability (10 * major +
    minor), which FA4's head-dim table depends on."""
    unequal = case.sq != case.skv   # TE compares max_seqlen_q with max_seqlen_kv, not each sequence
    top_left = case.alignment == "top_left"
    mask_type, window = te_mask(case)
    sliding = window is not None and (window[0] != -1 or window[1] not in (-1, 0))
    fa4_dims = fa4_head_dim_reason(arch, case.d_qk, case.d_v) if flash_major == "4" else None
    rows = [
        (case.fp8 is not None, f"fp8={case.fp8!r}: {backend} is fed q / k / v in the case's dtype here; TE's "
                               f"FP8 attention is te-fused-fp8 (te/fp8.py)"),
        (case.dtype not in DTYPES[backend], f"dtype {case.dtype}: TE's {backend} takes {' / '.join(DTYPES[backend])}"),
        (case.mask_density is not None and backend != sel.UNFUSED,
         f"explicit boolean mask ('arbitrary' mask type): TE runs it only on {sel.UNFUSED}"),
        (case.mask_density is not None and case.layout == "thd",
         "explicit boolean mask with thd: TE's thd needs a padding mask type, 'arbitrary' is not one"),
        ("strided" in case.storage, f"storage={case.storage!r}: a head dim with stride 2, and TE asserts 'q, k and v "
                                    f"must have stride 1 in their last dimension' before any backend"),
    ]
    if backend == sel.FLASH:
        rows += [
            (case.softmax != "vanilla", f"softmax={case.softmax}: TE disables FlashAttention for sink softmax"),
            (mask_type in ("causal", "padding_causal") and unequal,
             "top-left causal with sq != skv: TE's FlashAttention only has bottom-right causal"),
            (top_left and sliding and unequal,
             "top-left sliding window with sq != skv: TE's FlashAttention only aligns windows bottom-right"),
            (top_left and case.alibi_slopes is not None and unequal,
             "top-left ALiBi with sq != skv: TE's FlashAttention only aligns ALiBi bottom-right"),
            (fa4_dims is not None, f"{fa4_dims} (TE validates FA4's head dims and disables it)"),
            (flash_major == "4" and case.softcap is not None, "softcap: TE does not pass softcap to FA4"),
            (flash_major == "4" and case.alibi_slopes is not None, "ALiBi: TE disables FA4 for ALiBi"),
            (flash_major == "3" and case.alibi_slopes is not None, "ALiBi: TE disables FA3 for ALiBi"),
        ]
    if backend == sel.FUSED:
        rows += [
            (case.d_qk % 8 != 0 or case.d_v % 8 != 0,
             f"head dims ({case.d_qk}, {case.d_v}): cuDNN's fp16/bf16 SDPA needs multiples of 8 (TE logs "
             f"'hidden_dim should be multiple of 8')"),
            (case.softcap is not None, "softcap: TE's FusedAttention does not support it"),
            (sliding and case.sq > case.skv, "sliding window with sq > skv: TE's FusedAttention does not support it"),
            (case.softmax != "vanilla" and case.sq == 1,
             f"softmax={case.softmax} with sq = 1: cuDNN's SDPA has no decode-only mode with a sink token (TE logs "
             f"'decode only mode, i.e. s_q == 1, not supported with sink_token')"),
        ]
    return rows


def _logical_out(case: Case, out: torch.Tensor) -> torch.Tensor:
    """TE's [b, s, h*d_v] / [s, b, h*d_v] / [t, h*d_v] output as [b, sq, h, d_v]."""
    if case.layout == "thd":
        return unpack(out.reshape(out.shape[0], case.h, case.d_v), case.lens_q, case.sq)
    out = out.reshape(*out.shape[:2], case.h, case.d_v)
    return out.transpose(0, 1) if case.layout == "sbhd" else out


class TransformerEngineAttention(Backend):
    """DotProductAttention with only `te_backend` eligible; one adapter per TE backend."""

    family = "te"
    library_module = f"{LIBRARY}.pytorch"

    def __init__(self, name: str, te_backend: str, device: str = "cuda") -> None:
        self.name, self.te_backend, self.device = name, te_backend, device
        if te_backend == sel.UNFUSED:  # its logits are a matmul in the input dtype (oracles/tolerance.py)
            self.family = "te-unfused"
        elif te_backend == sel.FUSED:  # cuDNN rounds dS with the softmax scale in it (oracles/tolerance.py)
            self.family = "te-fused"

    def _te(self):
        return import_te()

    def load(self) -> str | None:
        try:
            self._te()
        except Exception as e:  # TE raises more than ImportError when its CUDA libraries are missing
            return f"TransformerEngine does not import ({type(e).__name__}: {e})"
        return None

    def available(self) -> str | None:
        missing = self.load()
        if missing is not None:
            return missing
        if not str(self.device).startswith("cuda") or not torch.cuda.is_available():
            return f"TransformerEngine needs a CUDA device (device={self.device!r})"
        if self.te_backend == sel.FLASH and not sel.flash_versions():
            return "TE loaded no flash-attn (2, 3 or 4), so it has no FlashAttention backend"
        return None

    def _flash_major(self) -> str | None:
        if self.te_backend != sel.FLASH:
            return None
        try:
            versions = sel.flash_versions()
        except Exception:  # TE not importable here: the version-specific rows are left to TE at run time
            return None
        return max(versions) if versions else None

    @property
    def arch(self) -> int:
        """The compute capability the capability table is read at: the device's, else sm90."""
        return fc.cuda_arch(self.device) or DEFAULT_ARCH

    def unsupported(self, case: Case) -> str | None:
        """The rules that need no flash-attn version first (they come first in the table as well), so a case they
        refuse is refused without importing TE; the version's rules after."""
        known = applicable_spellings(case, self.te_backend)
        spelled = (case.spelling not in known,
                   f"spelling={case.spelling!r} is not one of {self.name}'s spellings here: {list(known)}")
        static = first_reason(spelled, *capability_refusals(case, self.te_backend, None, self.arch))
        if static is not None or self.te_backend != sel.FLASH:
            return static
        return first_reason(*capability_refusals(case, self.te_backend, self._flash_major(), self.arch))

    def spellings(self, case: Case) -> tuple[str, ...]:
        """The applicable spellings this backend takes (a spelling can turn on a rule, e.g. a finite window)."""
        major, arch = self._flash_major(), self.arch
        return tuple(s for s in applicable_spellings(case, self.te_backend)
                     if s == "" or first_reason(*capability_refusals(case.replace(spelling=s), self.te_backend,
                                                                     major, arch)) is None)

    def run(self, case: Case, tensors: Tensors) -> Output:
        reason = self.unsupported(case)
        if reason:
            raise Unsupported(reason)
        te = self._te()
        leaves = tuple(x.detach().requires_grad_(case.grads) for x in (tensors.q, tensors.k, tensors.v))
        logical = Tensors(*leaves, tensors.mask, tensors.sink, tensors.alibi, tensors.dout)
        init, args, kwargs = te_call(case, logical, self.te_backend)
        with sel.forced_backend(self.te_backend), warnings.catch_warnings():
            # unbounded-window: TE warns as it turns a causal type's (-1, -1) into (-1, 0), the spelling's point
            warnings.filterwarnings("ignore", message="window_size should be")
            dpa = te.DotProductAttention(**init)
            dpa.train(case.grads)
            if case.softmax == "learnable":
                with torch.no_grad():
                    dpa.softmax_offset.copy_(tensors.sink)
            with sel.watched(dpa) as selection:
                out = sel.called(self.te_backend, selection, lambda: dpa(*args, **kwargs))
            ran = sel.check_ran(self.te_backend, selection)
            out = _logical_out(case, out)
            grads = (torch.autograd.grad(out, leaves, tensors.dout.to(out.dtype)) if case.grads
                     else (None, None, None))
        return Output(out=out.detach(), lse=None, dq=grads[0], dk=grads[1], dv=grads[2], ran=ran)

    def repro_source(self, case: Case) -> str | None:
        """Source of `attention(q, k, v)` making run()'s construction and call with only this backend enabled, for
        standalone repro scripts (fuzz/store/repro.py); None for a spelling this backend does not take."""
        known = applicable_spellings(case, self.te_backend)
        return te_source(self, case) if case.spelling in known else None

    def version(self) -> str:
        return te_version()


class TEFlashAttention(TransformerEngineAttention):
    """te-flash: DotProductAttention forced onto FlashAttention, which on FA4 JIT-compiles a kernel per configuration
    (so its search is compile-aware, fuzz/engine/compiled_search.py)."""

    build_errors = fc.CUTE_BUILD_ERRORS   # FA4's, raised through TE

    def __init__(self, device: str = "cuda") -> None:
        super().__init__("te-flash", sel.FLASH, device)

    def compile_key(self, case: Case) -> tuple | None:
        """The configuration of the FA4 kernel TE calls (FlashAttn4.compile_key's fields, read off TE's call, flash_call)
        and of TE's own path to it: dtype, head dims, GQA group, causal, which window sides are unbounded (-1), the
        entry point (varlen for thd and padding), the layout TE converts from, gradients, the architecture. None
        where TE loaded no FA4 (FA2 / FA3 are compiled ahead of time)."""
        if self._flash_major() != "4":
            return None
        causal, (left, right), entry = flash_call(case)
        return (case.dtype, case.d_qk, case.d_v, case.h // case.hk, causal, left < 0, right < 0, entry, case.layout,
                case.grads, self.arch)


BACKENDS = {
    "te-flash": TEFlashAttention,
    "te-fused": lambda device="cuda": TransformerEngineAttention("te-fused", sel.FUSED, device),
    "te-unfused": lambda device="cuda": TransformerEngineAttention("te-unfused", sel.UNFUSED, device),
}
