"""torch's paged attention for flex_attention ("flex-paged"): `PagedAttention` of
torch.nn.attention.experimental._paged_attention (private and experimental; in torch 2.6 through 2.13), with
flex_attention run eagerly over its physical cache.

What PagedAttention does, read from its source: PagedAttention(n_pages, page_size, max_batch_size) keeps
page_table [b, n_pages] (logical page -> physical page, -1 where none) and physical_to_logical [b, n_pages]; the
caches it serves are one flat [1, hk, n_pages * page_size, d] tensor each for k and v. reserve(batch_idx, seq_len)
allocates pages and assign(batch_idx, input_pos, k_val, v_val, k_cache, v_cache) writes keys through the page table.
convert_logical_block_mask(block_mask, kv_len=...) turns a block mask over logical key blocks (its key block size must
be the page size) into one over physical blocks, whose mask_mod reads a physical key's logical position through
physical_to_logical and drops keys at or past kv_len[b]; get_score_mod(score_mod, kv_len) does the same for a
score_mod, so the case's mods (fuzz/backends/flex/mods.py) keep seeing logical positions.

Spellings: "" writes the case's pool (strategies/paged.py: shuffled pages, shared prefix pages, garbage in every slot
no sequence owns) into the flat caches and its block table into page_table / physical_to_logical; "assign" fills
them through PagedAttention's own reserve() and assign() over caches of garbage (no shared prefix pages: reserve gives
each sequence pages of its own). Forward only; queries batched [b, h, sq, d]; no sinks (flex's softmax has none).
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from attnfuzz.backends.base import Backend, first_reason
from attnfuzz.backends.flex.mods import chain, mods_of
from attnfuzz.backends.flex.pages import assigned_cache, page_table_cache, pool_pages
from attnfuzz.backends.flex.repro import paged_source
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors
from attnfuzz.strategies.paged import GARBAGE_K, GARBAGE_V, paged_kv

ASSIGN = "assign"
Q_BLOCK = 128


class FlexPaged(Backend):
    name = "flex-paged"
    family = "flex"
    serves_paged = True

    def __init__(self, device: str = "cpu") -> None:
        self.device = str(device)

    def version(self) -> str:
        return torch.__version__

    def available(self) -> str | None:
        try:
            from torch.nn.attention.experimental._paged_attention import PagedAttention  # noqa: F401
            from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
        except ImportError as e:
            return f"{self.name}: torch {torch.__version__} has no flex_attention PagedAttention ({e})"
        if torch.device(self.device).type == "cuda" and not torch.cuda.is_available():
            return f"{self.name}: device {self.device!r} is not usable here (torch.cuda.is_available() is False)"
        return None

    def spellings(self, case: Case) -> tuple[str, ...]:
        return ("",) if case.shared_prefix_pages else ("", ASSIGN)

    def unsupported(self, case: Case) -> str | None:
        return first_reason(
            (not case.paged, "PagedAttention serves a paged KV cache: the case needs page_size"),
            (case.softmax != "vanilla", f"softmax={case.softmax!r}: flex_attention's softmax has no sink term"),
            (case.layout == "thd", "PagedAttention's flex call takes queries batched [b, h, sq, d], not packed (thd)"),
            (case.spelling not in self.spellings(case),
             f"spelling={case.spelling!r} is not one of {self.name}'s spellings for this case: "
             f"{list(self.spellings(case))}"),
        )

    def paged_attention(self, case: Case, t: Tensors):
        """(PagedAttention with the case's pages, flat k cache, flat v cache, kv_len), per the spelling
        (fuzz/backends/flex/pages.py builds them)."""
        cache = paged_kv(case, t.k, t.v)
        args = (case.page_size, pool_pages(cache), GARBAGE_K, GARBAGE_V)
        if case.spelling == ASSIGN:
            paged, k_flat, v_flat = assigned_cache(t.k, t.v, case.lens_kv, *args)
        else:
            paged, k_flat, v_flat = page_table_cache(t.k, t.v, cache.block_table, case.lens_kv, *args)
        return paged, k_flat, v_flat, cache.cache_seqlens.long()

    def repro_source(self, case: Case) -> str | None:
        """Source of `attention(q, k, v)` building the caches and making run()'s call, for standalone repro scripts
        (fuzz/store/repro.py); None for a case the adapter refuses."""
        if self.unsupported(case) is not None:
            return None
        return paged_source(case, q_block=Q_BLOCK, assign=case.spelling == ASSIGN)

    def run(self, case: Case, tensors: Tensors) -> Output:
        from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention
        paged, k_flat, v_flat, kv_len = self.paged_attention(case, tensors)
        size = paged.page_size
        logical_len = max(1, -(-case.skv // size)) * size
        if tensors.mask is not None:  # the mods see logical keys up to the last page's end: the mask must reach it
            mask = torch.nn.functional.pad(tensors.mask, (0, logical_len - case.skv), value=False)
            tensors = dataclasses.replace(tensors, mask=mask)
        # keys past each cache are left to PagedAttention's kv_len bound, the serving API's own
        mask_mod, score_mods = mods_of(case, tensors, tensors.q.device, key_padding=False)
        block_mask = create_block_mask(mask_mod or (lambda b, h, q_idx, kv_idx: q_idx >= 0), case.b, None, case.sq,
                                       logical_len, device=tensors.q.device, BLOCK_SIZE=(Q_BLOCK, size))
        physical = paged.convert_logical_block_mask(block_mask, kv_len=kv_len)
        score_mod = paged.get_score_mod(chain(*score_mods), kv_len) if score_mods else None
        with warnings.catch_warnings():  # eager is what this backend runs
            warnings.filterwarnings("ignore", "flex_attention called without torch.compile", UserWarning)
            out, aux = flex_attention(tensors.q.transpose(1, 2), k_flat, v_flat, score_mod=score_mod,
                                      block_mask=physical, scale=case.scale, enable_gqa=case.hk < case.h,
                                      return_aux=AuxRequest(lse=True))
        ran = f"flex_attention eager over PagedAttention ({'assign' if case.spelling else 'page table'} filled)"
        return Output(out=out.transpose(1, 2).detach(), lse=aux.lse.detach(), ran=ran)


BACKENDS = {"flex-paged": FlexPaged}
