"""PagedAttention's caches (torch.nn.attention.experimental._paged_attention) built from the logical k / v: shared by
the flex-paged adapter's run() (fuzz/backends/flex/paged.py) and its repro writer, which embeds the cache builders
verbatim (they need nothing but torch and layout.pool_from_table), so a script builds the very caches the run built.

PagedAttention(n_pages, page_size, max_batch_size) keeps page_table [b, n_pages] (logical page -> physical page) and
physical_to_logical [b, n_pages]; the caches it serves are one flat [1, hk, n_pages * page_size, d] tensor each.
"""

from __future__ import annotations

import torch

from attnfuzz.backends.layout import pool_from_table
from attnfuzz.strategies.paged import PagedKV


def pool_pages(cache: PagedKV) -> int:
    """PagedAttention's n_pages for a case's paged cache: the pool's pages, or more where the block table is wider
    (page_table holds n_pages logical pages per sequence; a short cache of one used page may have a table of
    several), the extra pages garbage."""
    return max(cache.k_cache.shape[0], cache.block_table.shape[1])


def flat(cache: torch.Tensor) -> torch.Tensor:
    """A pool [num_pages, page_size, hk, d] as PagedAttention's flat cache [1, hk, num_pages * page_size, d]."""
    pages, size, hk, d = cache.shape
    return cache.permute(2, 0, 1, 3).reshape(1, hk, pages * size, d).contiguous()


def page_table_cache(k, v, block_table, lens, page_size, num_pages, garbage_k, garbage_v):
    """(PagedAttention, flat k cache, flat v cache) over the pool pool_from_table builds (sequence n's keys in the
    pages block_table[n] names, garbage in every other slot), its page_table and physical_to_logical filled from the
    block table (entries past a sequence's pages keep the table's own), each sequence's capacity its pages."""
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    k_cache, v_cache = pool_from_table(k, v, block_table, lens, page_size, num_pages, garbage_k, garbage_v)
    paged = PagedAttention(num_pages, page_size, k.shape[0], device=k.device)
    table = block_table.long().to(k.device)
    paged.page_table[:, :table.shape[1]] = table
    pages = [-(-length // page_size) for length in lens]
    for n, count in enumerate(pages):
        paged.physical_to_logical[n, table[n, :count]] = torch.arange(count, device=k.device)
    paged.capacity[:] = torch.tensor(pages, device=k.device) * page_size
    return paged, flat(k_cache), flat(v_cache)


def assigned_cache(k, v, lens, page_size, num_pages, garbage_k, garbage_v):
    """(PagedAttention, flat k cache, flat v cache): caches of garbage, then each non-empty sequence's pages taken by
    PagedAttention's own reserve() and its keys written through its own assign()."""
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    device, size = k.device, num_pages * page_size
    paged = PagedAttention(num_pages, page_size, k.shape[0], device=device)
    k_flat = torch.full((1, k.shape[2], size, k.shape[3]), garbage_k, dtype=k.dtype, device=device)
    v_flat = torch.full((1, v.shape[2], size, v.shape[3]), garbage_v, dtype=v.dtype, device=device)
    for n, length in enumerate(lens):
        if length == 0:
            continue
        index = torch.tensor([n], device=device)
        paged.reserve(index, torch.tensor(length, device=device))
        positions = torch.arange(length, device=device)[None]
        paged.assign(index, positions, k[n:n + 1, :length].transpose(1, 2), v[n:n + 1, :length].transpose(1, 2),
                     k_flat, v_flat)
    return paged, k_flat, v_flat
