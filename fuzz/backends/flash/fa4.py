"""flash-attn 4 (`flash_attn.cute`, the CuTe DSL kernels; read from flash-attn-4 4.0.0b36).

flash_attn_func / flash_attn_varlen_func(q, k, v, ..., softmax_scale, causal, window_size=(None, None),
learnable_sink, softcap, ..., return_lse) -> (out, lse). Bands are bottom-right aligned and None means an unbounded
side; a pair of two negative bounds is read as (None, None), but since flash-attention#2490 a pair with one negative
bound is kept literally, so causal=True with window (-1, 0) is an empty band (seed story 003). The "neg" spellings
keep that case in the fuzzed space on purpose. Sinks: learnable_sink [h] (zeros for off-by-one). LSE is the natural
log, [b, h, sq] batched or [h, total] varlen. Padding in a batched layout goes either packed through cu_seqlens
(default) or in place through seqused_q / seqused_k (spelling "seqused").

Paged KV caches (serving): flash_attn_varlen_func(q, k_cache, v_cache, page_table=block_table int32 [b, max_pages],
seqused_k=cache lengths, ...) with the pool [num_pages, page_size, hk, d]; q batched, or packed through
cu_seqlens_q (page_table excludes cu_seqlens_k). On sm90 a page size of 128 (the kernel's key tile) loads pages by
TMA, any other size through cp.async: both paths are drawn.

Kernel knobs are spellings too (KNOBS, each with the default mask spelling): "splits3" = num_splits=3 (split-KV and
its combine kernel; interface.py asserts "SplitKV not supported on SM 9.0", so sm100 / sm110 only), "nopack" =
pack_gqa=False (GQA cases only: the interface's default packs the query heads of a KV head, pack_gqa = h / hk > 1),
"deterministic" = deterministic=True (cases with gradients on sm100 / sm110: the backward asserts "bwd
deterministic only supported for sm100/sm110 for now"), "pack" = pack_gqa=True without GQA (h == hk: the default
resolves to False; nothing in _flash_attn_fwd refuses True, and its block counts read the group as
`qhead_per_kvhead if pack_gqa and qhead_per_kvhead > 1 else 1`). Each must give what the default gives. Other
values of one argument that mean the same attention (explicit scale, softcap None, no LSE, the sink's dtype) are
spellings too: fa4_forms.py.

sm90 backward (first H200 run): GQA with d_qk != d_v is an explicit assert in FlashAttentionBackwardSm90, declared
here as a refusal; two other sm90 backward failures are the library's, not refusals, and stay findings: a compile
error (MLIRError) for d_qk > d_v when d_v's 16-padded tile is narrower than the dO shared-memory swizzle atom sized
from d_qk, and a wrong dq when the kernel pads d to a multiple of 16 but interface.py pads the dq accumulator to 32
(seen: rows >= 64 exactly 0 for d = 8, 16; predicted for d = 40, 48, 72, 80).
"""

from __future__ import annotations

import importlib
import os
from importlib import metadata

import torch

from attnfuzz.backends.flash import common as fc
from attnfuzz.backends.flash.fa4_forms import FORMS, form_kwargs, form_spellings, kernel_key
from attnfuzz.backends.flash.repro import flash_source
from attnfuzz.backends.base import Backend, Unsupported, first_reason
from attnfuzz.backends.layout import cu_seqlens
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

LIBRARY = "flash-attn-4"
MODULE = "flash_attn.cute"
DISTRIBUTION = "flash-attn-4"
DTYPES = ("float16", "bfloat16")
ARCHS = (80, 90, 100, 103, 110, 120, 121)   # the interface asserts arch // 10 in 8..12
BACKWARD_MIN_ARCH = 90
DEFAULT_ARCH = 90                           # the table applied when no CUDA device says otherwise (H100 / H200)
SEQUSED = "seqused"
DISK_CACHE = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"


def use_disk_cache() -> None:
    """FA4's persistent JIT cache on unless the user set DISK_CACHE: every new kernel configuration costs 1.6-3 s of
    compilation, and without the disk cache each fresh process (an isolated worker after a crash, every campaign
    lane, TE's FlashAttention in its own process) compiles it again. FA4 reads the variable once, when
    flash_attn.cute is first imported; its cache lives in FLASH_ATTENTION_CUTE_DSL_CACHE_DIR (default
    /tmp/$USER/flash_attention_cute_dsl_cache) and is keyed by FA4's own sources."""
    os.environ.setdefault(DISK_CACHE, "1")


def import_fa4():
    """flash_attn.cute, imported with the disk cache on (use_disk_cache)."""
    use_disk_cache()
    return importlib.import_module(MODULE)


def head_dim_reason(arch: int, d_qk: int, d_v: int) -> str | None:
    """FA4's _validate_head_dims, per architecture (16 bytes of alignment: multiples of 8 in fp16/bf16)."""
    if arch // 10 == 9:
        if not (8 <= d_qk <= 256 and 8 <= d_v <= 256) or d_qk % 8 or d_v % 8:
            return f"head dims ({d_qk}, {d_v}) on sm{arch}: FA4 needs 8..256, multiples of 8"
    elif arch // 10 in (10, 11):
        standard = 8 <= d_qk <= 128 and 8 <= d_v <= 128
        special = (d_qk, d_v) in ((192, 128), (256, 256)) or ((d_qk == 64 or d_qk == d_v) and d_v == 512)
        if not (standard or special) or d_qk % 8 or d_v % 8:
            return (f"head dims ({d_qk}, {d_v}) on sm{arch}: FA4 needs 8..128 (multiples of 8), (192, 128), "
                    f"(256, 256) or (64, 512)")
    return None


def capability_refusals(case: Case, arch: int) -> list[tuple[bool, str]]:
    """FA4's capability table on one architecture: (refused, reason) rows, first match wins."""
    _, band_reason = fc.bottom_right_band(case)
    dims = head_dim_reason(arch, case.d_qk, case.d_v)
    return [
        (case.dtype not in DTYPES, f"dtype {case.dtype}: FA4 takes {' / '.join(DTYPES)} (fp8 is not in the Case)"),
        (dims is not None, dims or ""),
        (case.grads and arch < BACKWARD_MIN_ARCH, f"gradients on sm{arch}: FA4's backward needs sm90+"),
        (case.grads and arch // 10 == 9 and case.h != case.hk and case.d_qk != case.d_v,
         f"gradients with GQA (h={case.h}, hk={case.hk}) and d_qk={case.d_qk} != d_v={case.d_v} on sm{arch}: "
         f"FA4's sm90 backward asserts 'GQA backward requires head_dim == head_dim_v'"),
        (case.mask_density is not None,
         "explicit boolean mask: FA4 takes masks only as a CuTe DSL mask_mod, which this adapter does not compile"),
        (case.alibi_slopes is not None, "ALiBi: FA4 has no alibi_slopes (only a CuTe DSL score_mod could add it)"),
        (band_reason is not None, band_reason or ""),
        (case.paged and case.page_size != 128 and arch // 10 == 9 and (case.d_qk % 16 or case.d_v % 16),
         f"paged with page_size={case.page_size} and head dims ({case.d_qk}, {case.d_v}) on sm{arch}: FA4 loads such "
         f"pages by cp.async, which asserts 'Paged KV does not support irregular head dim' (multiples of 16 only)"),
    ]


KNOBS = {"splits3": {"num_splits": 3}, "nopack": {"pack_gqa": False}, "deterministic": {"deterministic": True},
         "pack": {"pack_gqa": True}}
SPLIT_ARCHS = (100, 103, 110)  # num_splits > 1 and a deterministic backward: sm100 / sm110 only


def knob_spellings(case: Case, arch: int) -> tuple[str, ...]:
    """The knob spellings FA4 takes for this case on `arch` (the module's docstring says why each is where it is)."""
    split_kv = arch // 10 in (10, 11)
    valid = {"splits3": split_kv, "nopack": case.h > case.hk, "deterministic": split_kv and case.grads,
             "pack": case.h == case.hk}
    return tuple(name for name in KNOBS if valid[name])


def knob_kwargs(spelling: str) -> dict:
    """The keyword arguments a knob spelling adds to the call ({} for the others)."""
    return dict(KNOBS.get(spelling, {}))


def split_spelling(spelling: str) -> tuple[bool, str]:
    """(use seqused, mask spelling) from e.g. "seqused+causal+window"; a knob or form spelling has the default
    mask."""
    if spelling in KNOBS or spelling in FORMS:
        return False, ""
    if spelling == SEQUSED or spelling.startswith(SEQUSED + "+"):
        return True, spelling[len(SEQUSED) + 1:]
    return False, spelling


class FlashAttn4(Backend):
    name = "fa4"
    family = "fa4"
    serves_paged = True
    build_errors = fc.CUTE_BUILD_ERRORS
    library_module = MODULE

    def __init__(self, device: str = "cuda", arch: int | None = None) -> None:
        self.device = device
        self._arch = arch

    @property
    def arch(self) -> int:
        """The compute capability the capability table is read at: given, else the device's, else sm90."""
        return self._arch or fc.cuda_arch(self.device) or DEFAULT_ARCH

    def load(self) -> str | None:
        try:
            import_fa4()
        except ImportError as e:
            return f"{LIBRARY} is not installed or does not load ({e}); pip install flash-attn-4"
        return None

    def available(self) -> str | None:
        missing = self.load()
        if missing is not None:
            return missing
        arch = fc.cuda_arch(self.device)
        if arch is None:
            return f"{LIBRARY} needs a CUDA device (device={self.device!r})"
        if arch not in ARCHS:
            return f"{LIBRARY} runs on sm80 / sm90 / sm100 / sm110 / sm120, this GPU is sm{arch}"
        return None

    def unsupported(self, case: Case) -> str | None:
        return first_reason(*capability_refusals(case, self.arch),
                            fc.spelling_refusal(self.name, case, self.spellings(case)))

    def spellings(self, case: Case) -> tuple[str, ...]:
        band, _ = fc.bottom_right_band(case)
        masks = fc.mask_spellings(band, with_negative=True) if band is not None else ("",)
        if case.padded and case.layout != "thd":
            masks += tuple(SEQUSED if m == "" else f"{SEQUSED}+{m}" for m in masks)
        varlen = self.route(case.replace(spelling="")) != fc.BATCHED
        return masks + knob_spellings(case, self.arch) + form_spellings(case, varlen=varlen)

    def call_kwargs(self, case: Case, t: Tensors) -> dict:
        """The keyword arguments of the FA4 call for this case and spelling (shared by run() and the tests)."""
        band, reason = fc.bottom_right_band(case)
        if band is None:
            raise Unsupported(reason)
        _, mask_spelling = split_spelling(case.spelling)
        causal, window = fc.spelled_mask(band, mask_spelling, case, unbounded=None)
        return {"softmax_scale": case.scale, "causal": causal, "window_size": window, "learnable_sink": t.sink,
                "softcap": case.softcap or 0.0, "return_lse": True, **knob_kwargs(case.spelling),
                **form_kwargs(case, case.spelling, t)}

    def compile_key(self, case: Case) -> tuple | None:
        """What FA4's interface keys its compiled kernels by (flash_attn.cute.interface: compile_key), read off the
        case: dtype, head dims, the GQA group (pack_gqa, qhead_per_kvhead), causal, which window bounds are set (a
        pair of negative bounds reads as unbounded), softcap and sink presence, which call (cu_seqlens / seqused /
        batched, paged), whether pages are loaded by TMA (a page of 128 keys, the sm90 key tile), the backward kernels
        when gradients are asked, the architecture, the knobs, and what a form changes (fa4_forms.kernel_key).
        Lengths, batch, heads at one group size, bound and scale values and the inputs are runtime arguments of one
        kernel."""
        band, _ = fc.bottom_right_band(case)
        if band is None:
            return None
        causal, (left, right) = fc.spelled_mask(band, split_spelling(case.spelling)[1], case, unbounded=None)
        if left is not None and right is not None and left < 0 and right < 0:
            left = right = None
        return (case.dtype, case.d_qk, case.d_v, case.h // case.hk, causal, left is not None, right is not None,
                case.softcap is not None, case.softmax != "vanilla", self.route(case), case.grads, self.arch,
                None if case.page_size is None else case.page_size == 128,   # paged_kv_tma: pages of one key tile
                tuple(sorted(knob_kwargs(case.spelling).items())),           # is_split_kv, pack_gqa, deterministic
                kernel_key(case, case.spelling))                              # lse is None, sink dtype, bwd softcap

    def route(self, case: Case) -> str:
        """Which call takes the case: VARLEN (thd, or padding spelled through cu_seqlens), SEQUSED (padding in place,
        spelling "seqused") or BATCHED."""
        seqused, _ = split_spelling(case.spelling)
        if case.paged:
            q_padded = case.lens_q != (case.sq,) * case.b
            return fc.PAGED_PACKED if case.layout == "thd" or (q_padded and not seqused) else fc.PAGED
        if case.layout == "thd" or (case.padded and not seqused):
            return fc.VARLEN
        return fc.SEQUSED if seqused else fc.BATCHED

    def repro_source(self, case: Case) -> str | None:
        """Source of `attention(q, k, v)` making run()'s call, for standalone repro scripts (fuzz/store/repro.py); None
        for a case the adapter cannot spell."""
        return flash_source(self, case, module=MODULE, library=LIBRARY, positional_varlen=False)

    def run(self, case: Case, tensors: Tensors) -> Output:
        reason = self.unsupported(case)
        if reason:
            raise Unsupported(reason)
        api = import_fa4()
        kwargs = self.call_kwargs(case, tensors)
        fn = self.route(case)
        x = fc.flash_inputs(case, tensors, packed=fn in (fc.VARLEN, fc.PAGED_PACKED))
        try:  # the library's own input checks (forward or backward) are refusals; anything else is a crash
            if fn in (fc.PAGED, fc.PAGED_PACKED):
                out, lse = api.flash_attn_varlen_func(x.q, **{**fc.paged_call(case, tensors, x), **kwargs})
            elif fn == fc.VARLEN:
                lengths = {"cu_seqlens_q": x.cu_q, "cu_seqlens_k": x.cu_k, "max_seqlen_q": case.sq,
                           "max_seqlen_k": case.skv}
                out, lse = api.flash_attn_varlen_func(x.q, x.k, x.v, **{**lengths, **kwargs})
            elif fn == fc.SEQUSED:
                used_q, used_k = (cu_seqlens(lens, x.q.device).diff() for lens in (case.lens_q, case.lens_kv))
                lengths = {"seqused_q": used_q, "seqused_k": used_k, "max_seqlen_q": case.sq,
                           "max_seqlen_k": case.skv}
                out, lse = api.flash_attn_varlen_func(x.q, x.k, x.v, **{**lengths, **kwargs})
            else:
                out, lse = api.flash_attn_func(x.q, x.k, x.v, **kwargs)
            out = fc.logical_out(case, x, out)
            dq, dk, dv = fc.gradients(case, x, out, tensors)
        except Exception as e:
            refused = fc.refusal(e, LIBRARY)
            if refused is None:
                raise
            raise refused from e
        knobs = "".join(f", {name}={kwargs[name]}" for name in ("num_splits", "pack_gqa", "deterministic")
                        if name in kwargs)
        forms = "".join(f", {name}={shown(value)}"
                        for name, value in form_kwargs(case, case.spelling, tensors).items())
        ran = f"{fn}(causal={kwargs['causal']}, window_size={kwargs['window_size']}{knobs}{forms})"
        lse = fc.logical_lse(case, x, lse) if kwargs["return_lse"] else None   # not asked for: the output alone
        return Output(out=out.detach(), lse=lse, dq=dq, dk=dk, dv=dv, ran=ran)

    def version(self) -> str:
        try:
            return metadata.version(DISTRIBUTION)
        except metadata.PackageNotFoundError:
            pass
        try:  # the package's own __version__ reads the wrong distribution name ("fa4") and says 0.0.0
            return str(getattr(import_fa4(), "__version__", "unknown"))
        except ImportError:
            return ""


def shown(value) -> str:
    """An argument as run()'s `ran` shows it: a tensor by its dtype (0-d: its value), anything else by str."""
    if not isinstance(value, torch.Tensor):
        return str(value)
    return f"tensor({value.item()})" if value.dim() == 0 else str(value.dtype)


BACKENDS = {"fa4": FlashAttn4}
