"""flash-attn 2's serving entry point, `flash_attn_with_kvcache` (flash-attn 2.8), over a contiguous or paged cache.

flash_attn_with_kvcache(q [b, sq, h, d], k_cache, v_cache, k=None, v=None, cache_seqlens=int32 [b],
block_table=None, softmax_scale, causal, window_size=(-1, -1), softcap, alibi_slopes, num_splits=0,
return_softmax_lse=True) -> (out [b, sq, h, d], lse [b, h, sq]). Forward only. Read from its docstring and
flash_api.cpp's checks:
- Without a block table the caches are [b, seqlen_cache, hk, d] and sequence n reads its first cache_seqlens[n] keys;
  the slots past that hold garbage here (strategies/paged.py's values), so a kernel that reads them is graded wrong.
  With one they are [num_blocks, page_block_size, hk, d], and page_block_size % 256 == 0 is a TORCH_CHECK.
- q has one length sq for every sequence; bands are bottom-right per sequence (query i sees keys up to
  i + cache_seqlens[n] + seqlen_new - sq), as flash-attn's other entry points.
- k / v (appending): the kernel first writes seqlen_new new keys per sequence at cache_seqlens[n] onward, then attends
  over cache_seqlens[n] + seqlen_new keys.
- sq = 1 with GQA and no window or ALiBi takes another path (the query heads of a KV head swapped into the query
  length, "seqlenq_ngroups_swapped"), which decode cases reach.

Spellings: flash-attn's mask spellings (common.mask_spellings), each alone or with "+split" (num_splits = 3: the
split-KV kernel and its combine step, where the heuristic would pick one split for small cases) and "+append" (each
sequence's last keys handed over as k / v, their cache slots garbage until the kernel writes them).
"""

from __future__ import annotations

import importlib

from attnfuzz.backends import source as src
from attnfuzz.backends.base import Backend, Unsupported, first_reason
from attnfuzz.backends.flash import common as fc
from attnfuzz.backends.flash import fa2
from attnfuzz.backends.flash.repro import kvcache_inputs_call, spelled_kwargs
from attnfuzz.backends.layout import pool_from_table
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors, materialize

ENTRY = "flash_attn_with_kvcache"
PAGE_MULTIPLE = 256
SPLITS = 3
SPLIT, APPEND = "split", "append"


def capability_refusals(case: Case) -> list[tuple[bool, str]]:
    """flash_attn_with_kvcache's table: FA2's, and what the entry point adds (rows: refused, reason)."""
    return [
        *fa2.capability_refusals(case),
        (case.grads, f"{ENTRY} is forward-only: no gradients"),
        (case.layout == "thd", f"{ENTRY} takes q batched [b, sq, h, d], not packed (thd)"),
        (case.lens_q != (case.sq,) * case.b,
         f"query lengths {list(case.lens_q)}: {ENTRY} takes one query length sq for every sequence"),
        (case.storage[1:] != ("plain", "plain"),
         f"storage {case.storage[1:]} of k / v: they reach {ENTRY} as a cache the adapter allocates (a contiguous "
         f"buffer, as a server's)"),
        (case.paged and case.page_size % PAGE_MULTIPLE != 0,
         f"page_size={case.page_size}: FA2's paged KV cache needs page_block_size % {PAGE_MULTIPLE} == 0"),
    ]


def appended(case: Case) -> int:
    """Keys per sequence the "+append" spelling hands over as k / v: up to sq, at most the shortest cache."""
    return min(case.sq, *case.lens_kv)


def compared_rows(case: Case, window: tuple[int, int]) -> int:
    """The query rows flash_api.cpp compares with the cache's length when k / v are appended ("If key is supplied, it
    must have seqlen <= the seqlen of the KV cache", though it compares the query): sq, or h / hk for one query of a
    GQA case with no window, no ALiBi and a head dim that is a multiple of 8, whose heads it folds into the query's
    rows first (seqlenq_ngroups_swapped). A decode step appending its key to a cache of fewer slots than the group
    size is refused so."""
    swapped = (case.sq == 1 and case.h > case.hk and window[0] < 0 and window[1] < 0 and case.d_qk % 8 == 0
               and case.alibi_slopes is None)
    return case.h // case.hk if swapped else case.sq


def split_spelling(spelling: str) -> tuple[str, bool, bool]:
    """(mask spelling, split, append) from e.g. "causal+window+split+append"."""
    parts = spelling.split("+") if spelling else []
    split, append = SPLIT in parts, APPEND in parts
    return "+".join(p for p in parts if p not in (SPLIT, APPEND)), split, append


def kvcache_source(backend, case: Case) -> str | None:
    """Source defining `attention(q, k, v)` for a kvcache adapter (fuzz/backends/flash/kvcache.py), or None for a
    case it refuses."""
    if backend.unsupported(case) is not None:
        return None
    t = materialize(case, "cpu")
    tensors, spelled = spelled_kwargs(backend.call_kwargs(case, t))
    named = {name.upper(): (x, f"{name}, as the adapter passes it") for name, x in tensors.items()}
    _, _, append = split_spelling(case.spelling)
    new = appended(case) if append else 0
    body = [f"from flash_attn import {ENTRY}", "",
            f"lens_kv = {list(case.lens_kv)!r}  # keys per sequence" + (f", the last {new} appended" if new else ""),
            kvcache_inputs_call("inputs", fc.kvcache_arguments(case, t, new), named),
            "out, lse = " + src.call(ENTRY, ["q", "**inputs"], spelled, indent=14),
            "return out"]
    doc = (f"flash-attn 2's {ENTRY} as attnfuzz's {backend.name} adapter calls it for spelling "
           f"{case.spelling!r}" + (f", over a paged cache of {case.page_size}-slot pages." if case.paged else "."))
    return src.preamble([pool_from_table, fc.kvcache_inputs], named) + src.attention(doc, body)


class FlashAttnKVCache(Backend):
    name = "fa2-kvcache"
    family = "fa2"
    serves_paged = True
    library_module = fa2.FlashAttn2.api

    def __init__(self, device: str = "cuda") -> None:
        self.device = device
        self.fa2 = fa2.FlashAttn2(device)

    def available(self) -> str | None:
        return self.fa2.available()

    def load(self) -> str | None:
        return self.fa2.load()

    def version(self) -> str:
        return self.fa2.version()

    def spellings(self, case: Case) -> tuple[str, ...]:
        band, _ = fc.bottom_right_band(case)
        masks = fc.mask_spellings(band, with_negative=False) if band is not None else ("",)
        # no appending into pages several sequences share: a serving cache copies such a page before writing it; and
        # none where flash_api.cpp's check of the query's rows against the cache's length refuses it (compared_rows)
        spelled = []
        for m in masks:
            knobs = ["", SPLIT]
            window = fc.spelled_mask(band, m, case, unbounded=-1)[1] if band is not None else (-1, -1)
            if appended(case) > 0 and not case.shared_prefix_pages and compared_rows(case, window) <= case.skv:
                knobs += [APPEND, f"{SPLIT}+{APPEND}"]
            spelled += ["+".join(p for p in (m, k) if p) for k in knobs]
        return tuple(spelled)

    def unsupported(self, case: Case) -> str | None:
        return first_reason(*capability_refusals(case),
                            fc.spelling_refusal(self.name, case, self.spellings(case)))

    def call_kwargs(self, case: Case, t: Tensors) -> dict:
        """Keyword arguments of the call other than the cache tensors (shared by run() and the repro)."""
        band, reason = fc.bottom_right_band(case)
        if band is None:
            raise Unsupported(reason)
        mask, split, _ = split_spelling(case.spelling)
        causal, window = fc.spelled_mask(band, mask, case, unbounded=-1)
        return {"softmax_scale": case.scale, "causal": causal, "window_size": window,
                "softcap": case.softcap or 0.0, "alibi_slopes": t.alibi, "num_splits": SPLITS if split else 0,
                "return_softmax_lse": True}

    def cache_inputs(self, case: Case, t: Tensors) -> dict:
        """k_cache, v_cache, cache_seqlens, block_table and (append) k / v as the call takes them."""
        _, _, append = split_spelling(case.spelling)
        return fc.kvcache_inputs(**fc.kvcache_arguments(case, t, appended(case) if append else 0))

    def route(self, case: Case) -> str:
        return f"{ENTRY}[paged]" if case.paged else ENTRY

    def repro_source(self, case: Case) -> str | None:
        return kvcache_source(self, case)

    def run(self, case: Case, tensors: Tensors) -> Output:
        reason = self.unsupported(case)
        if reason:
            raise Unsupported(reason)
        api = importlib.import_module(fa2.MODULE)
        kwargs = self.call_kwargs(case, tensors)
        try:
            out, lse = api.flash_attn_with_kvcache(tensors.q, **self.cache_inputs(case, tensors), **kwargs)
        except Exception as e:  # the library's own input checks are refusals; anything else is a crash
            refused = fc.refusal(e, fa2.LIBRARY)
            if refused is None:
                raise
            raise refused from e
        ran = f"{self.route(case)}(causal={kwargs['causal']}, window_size={kwargs['window_size']}, " \
              f"num_splits={kwargs['num_splits']})"
        return Output(out=out.detach(), lse=lse.detach().float(), ran=ran)


BACKENDS = {"fa2-kvcache": FlashAttnKVCache}
