"""flex_attention's kernel options as spellings of a case (flex-compiled): knobs that must not change the answer, so
each one is graded against the oracle like any other spelling. Read from torch 2.13's flex_attention.py and
torch/_inductor/kernel/flex/ (not yet checked against 2.11's, which the GPU runner has):

  prescale   PRESCALE_QK=True: q is scaled by scale * log2(e) before q.k, so a score_mod sees scale * log2(e) * q.k
             and the kernel works in base 2. Only a score_mod that commutes with that factor keeps the answer: none,
             or the mask as -inf (score_mask); softcap and ALiBi do not ("can be applied for certain score_mods").
  rows_safe  ROWS_GUARANTEED_SAFE=True: a promise that every row flex computes sees a key, so the kernel drops its
             guard for a row whose running maximum is -inf; offered only where no row is empty (empty_rows).
  triton     BACKEND="TRITON": the flex kernel, never the decode kernel AUTO may pick.
  decode     BACKEND="TRITON_DECODE": the decode kernel, which lowering raises for unless _use_flex_decoding holds:
             fewer than 128 query rows (thd: packed rows), and h // hk a power of two when enable_gqa.
  tiles32    BACKEND="TRITON", fwd_BLOCK_M = fwd_BLOCK_N = 32: the forward kernel's tiles (the default sparse block,
             128, is a multiple of them, which the lowering requires).
  flash      BACKEND="FLASH": the CuteDSL flash-attention-4 kernel. torch needs flash_attn.cute importable
             (ensure_flash_available); FA4 runs sm90+ here, fp16 / bf16, its head dims (fa4.head_dim_reason);
             forward only (the FLASH backward needs FA4's block-sparse backward API, which varies by release).
             A torch without pytorch/pytorch#181824 returns FLASH's LSE off by a factor ln 2 under torch.compile
             (pytorch/pytorch#181645): FAIL:LSE with "flash" there is that bug.

flex-eager (the dense math path, any device) takes the BACKEND spellings alone (EAGER_KNOBS): BACKEND is the one
option eager code reads, in flex_attention's own finalization, which converts the LSE from base 2 unless BACKEND is
FLASH (the conversion's rule since pytorch/pytorch#181824); the math path's statistics are in base 2 whatever BACKEND
says, so the LSE a user gets from eager flex with BACKEND="FLASH" must still be the natural-log one.

Compiled, all of them are CUDA-only: inductor's CPU template (flex_cpu.lower_cpu) reads none of them (a run with each gives the
default's bits: it compiles the same C++), so none is offered on CPU. Not spellings: BLOCKS_ARE_CONTIGUOUS (a promise
about each query block's list of key blocks, which only the built block mask shows; a band's two edge blocks break
it), FORCE_USE_FLEX_ATTENTION (the legacy spelling of "triton"; torch raises when it is combined with BACKEND).
"""

from __future__ import annotations

import functools

import torch

from attnfuzz.backends.flash.fa4 import head_dim_reason
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize

KNOBS = {
    "prescale": {"PRESCALE_QK": True},
    "rows_safe": {"ROWS_GUARANTEED_SAFE": True},
    "triton": {"BACKEND": "TRITON"},
    "decode": {"BACKEND": "TRITON_DECODE"},
    "tiles32": {"BACKEND": "TRITON", "fwd_BLOCK_M": 32, "fwd_BLOCK_N": 32},
    "flash": {"BACKEND": "FLASH"},
}
EAGER_KNOBS = ("triton", "decode", "flash")   # the BACKEND spellings: eager reads BACKEND (its LSE's finalization)
DECODE_MAX_ROWS = 127     # _use_flex_decoding: query length < 128
FLASH_MIN_ARCH = 90
FLASH_DTYPES = ("float16", "bfloat16")


def kernel_options(parts) -> dict | None:
    """The kernel_options a spelling's parts pass to flex_attention (None: no knob, torch's defaults)."""
    knobs = [KNOBS[p] for p in parts if p in KNOBS]
    return dict(knobs[0]) if knobs else None


def knob_refusal(name: str, case: Case, parts, *, device_type: str, arch: int | None,
                 flash_installed: bool) -> str | None:
    """Why knob `name` is not a spelling of `case` (with the spelling's other `parts`), or None where it is."""
    if name not in KNOBS:
        return f"{name!r} is not a flex kernel knob (knobs: {list(KNOBS)})"
    if device_type != "cuda":
        return (f"{name} ({KNOBS[name]}): inductor's CPU flex template ignores flex's kernel options (the same C++ "
                f"as without them): nothing to test on {device_type}")
    if name == "prescale" and (case.softcap is not None or case.alibi_slopes is not None):
        return ("prescale (PRESCALE_QK): the score_mod would see scale * log2(e) * q.k; softcap and ALiBi do not "
                "commute with that factor, so the answer changes by design")
    empty = empty_rows(case) if name == "rows_safe" else 0
    if empty:
        return (f"rows_safe (ROWS_GUARANTEED_SAFE): {empty} row(s) that flex computes see no key "
                f"(padding rows, an empty sequence, a band or mask that hides every key): the promise would be false")
    if name == "decode":
        rows = sum(case.lens_q) if case.layout == "thd" else case.sq
        group = 1 if "repeat_kv" in parts else case.h // case.hk
        if rows > DECODE_MAX_ROWS:
            return (f"decode (BACKEND='TRITON_DECODE'): {rows} query rows; torch's flex_decoding takes fewer than "
                    f"{DECODE_MAX_ROWS + 1} (_use_flex_decoding) and raises otherwise")
        if group & (group - 1):
            return (f"decode (BACKEND='TRITON_DECODE'): GQA group h // hk = {group} is not a power of two "
                    f"(_use_flex_decoding)")
    if name == "flash":
        if arch is None or arch < FLASH_MIN_ARCH:
            return f"flash (BACKEND='FLASH'): needs sm{FLASH_MIN_ARCH}+ here; the device is sm{arch}"
        if not flash_installed:
            return ("flash (BACKEND='FLASH'): torch finds no flash_attn.cute (ensure_flash_available); "
                    "pip install flash-attn-4")
        if case.dtype not in FLASH_DTYPES:
            return f"flash (BACKEND='FLASH'): dtype={case.dtype}; FA4 takes {list(FLASH_DTYPES)}"
        dims = head_dim_reason(arch, case.d_qk, case.d_v)
        if dims:
            return f"flash (BACKEND='FLASH'): {dims}"
        if case.grads:
            return ("flash (BACKEND='FLASH'): forward only: torch's FLASH backward leans on flash-attn-4's block-sparse "
                    "backward API, which changes between FA4 releases (flex_flash_attention.py raises "
                    "NotImplementedError where it is missing)")
    return None


def eager_refusal(name: str) -> str | None:
    """Why knob `name` is not a spelling of flex-eager's cases, or None (EAGER_KNOBS: no device or shape rule, since
    the math path runs whatever BACKEND names)."""
    if name not in KNOBS:
        return f"{name!r} is not a flex kernel knob (knobs: {list(KNOBS)})"
    if name not in EAGER_KNOBS:
        return (f"{name} ({KNOBS[name]}): flex-eager's dense math path reads no kernel option but BACKEND "
                f"(spellings {list(EAGER_KNOBS)})")
    return None


@functools.lru_cache(maxsize=1)
def flash_installed() -> bool:
    """torch's own rule for BACKEND='FLASH' (flash_attn.cute importable); False on a torch without FLASH."""
    try:
        from torch._inductor.kernel.flex.flex_flash_attention import ensure_flash_available
    except ImportError:
        return False
    return bool(ensure_flash_available())


def empty_rows(case: Case) -> int:
    """How many rows flex computes see no key: bshd / sbhd every row of [b, sq] (rows past a sequence's length are
    masked by the padding mask_mod, so they count), thd the packed rows. The case's semantics (strategies/case.py):
    row i of sequence n sees key j iff j < skv_n, the band holds and the explicit mask keeps it."""
    return _empty_rows(case.replace(spelling=""))


@functools.lru_cache(maxsize=256)
def _empty_rows(case: Case) -> int:
    mask = materialize(case, "cpu").mask if case.mask_density is not None else None
    empty = 0
    for n, (sq_n, skv_n) in enumerate(zip(case.lens_q, case.lens_kv)):
        if case.layout != "thd":
            empty += case.sq - sq_n      # padding rows: the padding mask hides every key from them
        if sq_n == 0:
            continue
        lo, hi = band_ranges(case, sq_n, skv_n)
        if mask is None:
            seen = hi >= lo
        else:
            j = torch.arange(skv_n)
            seen = (mask[n, 0, :sq_n, :skv_n] & (j >= lo[:, None]) & (j <= hi[:, None])).any(1)
        empty += int((~seen).sum())
    return empty


def band_ranges(case: Case, sq_n: int, skv_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys lo[i]..hi[i] that row i of a sequence of sq_n queries and skv_n keys sees by the band and alignment
    (no key where hi < lo)."""
    i = torch.arange(sq_n)
    off = skv_n - sq_n if case.alignment == "bottom_right" else 0
    lo = (i + off - case.left).clamp(min=0) if case.left is not None else torch.zeros_like(i)
    hi = (i + off + case.right).clamp(max=skv_n - 1) if case.right is not None else torch.full_like(i, skv_n - 1)
    return lo, hi

