"""What the flash-attn adapters (FA2 / FA3 / FA4) share: the case's band in flash-attn's bottom-right terms, the
mask spellings the flash APIs accept, and moving tensors into the API's layout (batched or packed varlen) and back.

flash-attn aligns every band to the bottom-right corner: query i of a sequence sees key j iff
    i + (skv_n - sq_n) - left <= j <= i + (skv_n - sq_n) + right.
A top-left band (off = 0) is the same set of keys with both bounds shifted by d = skv_n - sq_n
(left + d, right - d), which flash-attn can express when d is the same for every sequence and no shifted bound
goes negative.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnfuzz.backends.base import Unsupported
from attnfuzz.backends.layout import cu_seqlens, lse_from_packed, pack, pool_from_table, to_layout, unpack
from attnfuzz.strategies.case import Case, shifted_band, top_left_shifts
from attnfuzz.strategies.materialize import Tensors
from attnfuzz.strategies.paged import GARBAGE_K, GARBAGE_V, paged_kv

Bounds = tuple  # (left, right): int >= 0, or None for unbounded

BATCHED, VARLEN, SEQUSED = "flash_attn_func", "flash_attn_varlen_func", "flash_attn_varlen_func[seqused]"
PAGED, PAGED_PACKED = "flash_attn_varlen_func[paged]", "flash_attn_varlen_func[paged,cu_seqlens_q]"

# The exceptions of a CuTe DSL kernel that fails to build (FA4's JIT: ptxas out of registers, an MLIR verifier error):
# FA4 caches only the kernels that build, so every call of that configuration compiles and fails again
CUTE_BUILD_ERRORS = ("CompilerDiagnosticError", "MLIRError")
# Words in a library's own refusal message (TORCH_CHECK / assert) that mark a clean refusal, not a crash.
REFUSAL_WORDS = ("not supported", "does not support", "only supports", "only support", "should be a multiple",
                 "not yet supported")


def bottom_right_band(case: Case) -> tuple[Bounds | None, str | None]:
    """The case's (left, right) in flash-attn's bottom-right alignment, or (None, why it cannot be expressed)."""
    left, right = case.left, case.right
    if case.alignment == "bottom_right" or (left is None and right is None):
        return (left, right), None
    shifts = top_left_shifts(case)
    if len(shifts) > 1:
        return None, (f"top-left band with per-sequence skv - sq in {list(shifts)}: flash-attn aligns bands "
                      f"bottom-right and one window cannot shift by several offsets")
    d = shifts[0] if shifts else 0
    shifted = shifted_band(case, d)
    if any(b is not None and b < 0 for b in shifted):
        return None, (f"top-left band (left={left}, right={right}) with skv - sq = {d} needs the bottom-right "
                      f"window {shifted}, and flash-attn documents no negative bounds (FA2/FA3 read one as "
                      f"unbounded)")
    return shifted, None


def alibi_reason(case: Case) -> str | None:
    """flash-attn's ALiBi distance is |i + skv_n - sq_n - j| (bottom-right); a top-left case needs skv_n == sq_n."""
    if case.alibi_slopes is None or case.alignment == "bottom_right":
        return None
    if set(top_left_shifts(case)) - {0}:
        return "top-left ALiBi with skv != sq: flash-attn measures the ALiBi distance from the bottom-right diagonal"
    return None


def wide_bound(case: Case) -> int:
    """A window bound so wide it hides no key (max(sq, skv) covers every row at either alignment): a finite
    spelling of 'unbounded'."""
    return max(case.sq, case.skv)


def is_causal_band(band: Bounds) -> bool:
    return band[1] == 0


def mask_spellings(band: Bounds, *, with_negative: bool) -> tuple[str, ...]:
    """Equivalent spellings of one band in the flash APIs:
    ""               the causal flag alone for a causal band (right = 0), else the plain window;
    "window"         causal=False with the window (left, 0);
    "causal+window"  the causal flag and the window (left, 0);
    "wide"           each unbounded side as a finite bound wide enough to hide no key;
    "neg", "causal+neg" (FA4, `with_negative`): -1 for an unbounded side, the FA2-era sentinel that callers such as
                     TransformerEngine hand FA4 (seed story 003: FA4 after #2490 reads (-1, 0) as an empty band)."""
    names = [""]
    if is_causal_band(band):
        names += ["window", "causal+window"]
    if None in band:
        names.append("wide")
        if with_negative:
            names += ["neg", "causal+neg"] if is_causal_band(band) else ["neg"]
    return tuple(names)


PACKINGS = ("kvpacked", "qkvpacked")   # flash-attn 2's packed entry points (fa2_fa3.py says how they are called)


def split_packing(spelling: str) -> tuple[str, str]:
    """(mask spelling, packing) from e.g. "causal+window+kvpacked"; packing "" for the unpacked call."""
    parts = spelling.split("+") if spelling else []
    packing = next((p for p in parts if p in PACKINGS), "")
    return "+".join(p for p in parts if p != packing), packing


def packed_name(fn: str, packing: str) -> str:
    """flash_attn_func -> flash_attn_kvpacked_func, flash_attn_varlen_func -> flash_attn_varlen_qkvpacked_func."""
    return fn.replace("_func", f"_{packing}_func") if packing else fn


def spelling_refusal(backend: str, case: Case, known: tuple[str, ...]) -> tuple[bool, str]:
    """The capability row for case.spelling: refused when the backend has no such spelling for this case."""
    return (case.spelling not in known,
            f"spelling={case.spelling!r} is not one of {backend}'s spellings for this case: {list(known)}")


def spelled_mask(band: Bounds, spelling: str, case: Case, unbounded) -> tuple[bool, tuple]:
    """(causal, window_size) for one mask spelling; `unbounded` is the API's own unbounded value (-1 or None)."""
    if spelling not in ("", "window", "causal+window", "wide", "neg", "causal+neg"):
        raise ValueError(f"mask spelling {spelling!r} is unknown; known: '', window, causal+window, wide, neg, "
                         f"causal+neg")
    left, right = band
    if spelling in ("neg", "causal+neg"):
        unbounded = -1
    if spelling == "wide":
        wide = wide_bound(case)
        left, right = (wide if left is None else left), (wide if right is None else right)

    def fill(bound):
        return unbounded if bound is None else bound

    if spelling in ("causal+window", "causal+neg"):
        return True, (fill(left), 0)
    if spelling == "" and is_causal_band(band):
        return True, (fill(left), unbounded)
    return False, (fill(left), fill(right))


@dataclass
class FlashInputs:
    """q/k/v as the API takes them and the logical leaves autograd differentiates. `packed` means varlen (thd):
    q/k/v are [total, heads, d] with cu_seqlens; otherwise [b, s, heads, d] views (sbhd arrives seq-major)."""

    leaves: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    packed: bool
    cu_q: torch.Tensor | None = None
    cu_k: torch.Tensor | None = None


def flash_inputs(case: Case, t: Tensors, *, packed: bool) -> FlashInputs:
    """Leaves that require grad when the case checks gradients, moved into the case's layout: packed (varlen) when
    `packed`, else batched, with an sbhd case handed over as a seq-major [b, s, h, d] view."""
    leaves = tuple(x.detach().requires_grad_(case.grads) for x in (t.q, t.k, t.v))
    q, k, v = leaves
    if packed:
        return FlashInputs(leaves, pack(q, case.lens_q), pack(k, case.lens_kv), pack(v, case.lens_kv), True,
                           cu_seqlens(case.lens_q, q.device), cu_seqlens(case.lens_kv, q.device))
    if case.layout == "sbhd":
        q, k, v = (to_layout(case, x, ()).transpose(0, 1) for x in (q, k, v))
    return FlashInputs(leaves, q, k, v, False)


def logical_out(case: Case, inputs: FlashInputs, out: torch.Tensor) -> torch.Tensor:
    """The API's output back to [b, sq, h, d_v]."""
    return unpack(out, case.lens_q, case.sq) if inputs.packed else out


def logical_lse(case: Case, inputs: FlashInputs, lse: torch.Tensor | None) -> torch.Tensor | None:
    """The API's LSE ([h, total] packed, [b, h, sq] batched) as [b, h, sq] float32."""
    if lse is None:
        return None
    lse = lse.detach().float()
    return lse_from_packed(lse, case.lens_q, case.sq) if inputs.packed else lse


def gradients(case: Case, inputs: FlashInputs, out: torch.Tensor, t: Tensors):
    """(dq, dk, dv) in the logical shapes, by autograd through the API's backward; Nones when not asked."""
    if not case.grads:
        return None, None, None
    return torch.autograd.grad(out, inputs.leaves, t.dout.to(out.dtype))


def kvcache_inputs(k, v, lens_kv, new, block_table, page_size, num_pages, garbage_k, garbage_v):
    """k_cache, v_cache, cache_seqlens and (new > 0) the appended k / v of flash_attn_with_kvcache, from logical
    k / v [b, skv, hk, d]: sequence n's first lens_kv[n] - new keys in its cache (rows of a contiguous cache, or the
    pages block_table[n] names: pool_from_table), its last `new` keys handed over as k / v, and every other slot
    garbage."""
    lens = [n - new for n in lens_kv]
    if block_table is None:
        k_cache, v_cache = k.contiguous().clone(), v.contiguous().clone()
        for n, length in enumerate(lens):
            k_cache[n, length:], v_cache[n, length:] = garbage_k, garbage_v
    else:
        k_cache, v_cache = pool_from_table(k, v, block_table, lens, page_size, num_pages, garbage_k, garbage_v)
    inputs = {"k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
              "cache_seqlens": torch.tensor(lens, dtype=torch.int32, device=k.device)}
    if new:
        inputs["k"] = torch.stack([k[n, length:length + new] for n, length in enumerate(lens)])
        inputs["v"] = torch.stack([v[n, length:length + new] for n, length in enumerate(lens)])
    return inputs


def kvcache_arguments(case: Case, t: Tensors, new: int = 0) -> dict:
    """kvcache_inputs' arguments for a case, `new` keys appended: for a paged case the block table of
    strategies/paged.py (shuffled pages, shared prefix pages, a garbage page past each sequence's pages) and its
    pool's page count, else no table. Every flash-attn cache (FA2's flash_attn_with_kvcache, FA4's paged varlen call)
    and its repro script's are built from these."""
    table, pages = None, 0
    if case.paged:
        cache = paged_kv(case, t.k, t.v)
        table, pages = cache.block_table, cache.k_cache.shape[0]
    return {"k": t.k, "v": t.v, "lens_kv": case.lens_kv, "new": new, "block_table": table,
            "page_size": case.page_size, "num_pages": pages, "garbage_k": GARBAGE_K, "garbage_v": GARBAGE_V}


def paged_call(case: Case, t: Tensors, x: FlashInputs) -> dict:
    """The keyword arguments of a paged varlen call besides the case's own: the pool built from the logical k / v by
    kvcache_inputs (kvcache_arguments), seqused_k, page_table, and the queries' lengths (cu_seqlens_q when packed,
    else seqused_q when some are padded)."""
    cache = kvcache_inputs(**kvcache_arguments(case, t))
    call = {"k": cache["k_cache"], "v": cache["v_cache"], "seqused_k": cache["cache_seqlens"],
            "page_table": cache["block_table"], "max_seqlen_q": case.sq, "max_seqlen_k": case.skv}
    if x.packed:
        call["cu_seqlens_q"] = x.cu_q
    elif case.lens_q != (case.sq,) * case.b:
        call["seqused_q"] = cu_seqlens(case.lens_q, x.q.device).diff()
    return call


def refusal(exc: BaseException, library: str) -> Unsupported | None:
    """An Unsupported for a library's own input check (assert / TORCH_CHECK naming an unsupported feature);
    None for anything else, which the harness records as a crash."""
    message = str(exc)
    if isinstance(exc, (AssertionError, NotImplementedError)) or any(w in message for w in REFUSAL_WORDS):
        return Unsupported(f"{library} refused the case: {message.strip() or type(exc).__name__}")
    return None


def cuda_arch(device: str) -> int | None:
    """Compute capability as 10 * major + minor for a CUDA device string, None when there is no CUDA device."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return 10 * major + minor
