"""A case's keys as a serving kernel holds them: a paged KV cache built from the logical k / v.

    k_cache, v_cache  [num_pages, page_size, hk, d]  the pool, in the case's dtype; pool pages are in an order
                                                     shuffled from the case's seed, so a kernel that takes a
                                                     sequence's pages to be consecutive reads the wrong keys
    block_table       int32 [b, max_pages]           sequence n's logical page p is pool page block_table[n, p];
                                                     max_pages = ceil(skv / page_size)
    cache_seqlens     int32 [b]                      keys per sequence (the case's seqlens_kv)

The first `shared_prefix_pages` logical pages of every sequence are the same pool pages (the logical k / v hold the
same keys there, materialize makes them so). Every slot no sequence owns holds garbage: the slots of a last page past
its sequence's length, the block-table entries past a sequence's last page (they all name one page of garbage only,
`garbage_page`: in bounds, so a kernel that reads past its pages reads garbage instead of faulting), and that page.
Garbage is K = 0 and V = 1e4, large and finite: a key of logit 0 takes a share of a row like any drawn key, so a
read of one moves the row by ~1e4 / count (far past any bound), while a correct kernel that loads a whole page and
masks it multiplies 1e4 by an exact 0 (NaN would poison that correct kernel, inf would overflow its sums). A row
whose logits all sit far above 0 (extreme-logit cases) can hide a garbage key: that limit is known.

The oracle never sees this form; it reads the logical k / v (the view `logical_kv` rebuilds, tested equal).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnfuzz.strategies.case import Case

GARBAGE_K = 0.0
GARBAGE_V = 1e4
_SHUFFLE = 0x9E3779B97F4A7C15  # mixed into the seed, so the page order is not the stream of the tensor draw


@dataclass(frozen=True)
class PagedKV:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor
    pages: tuple[int, ...]    # pages each sequence uses: ceil(cache_seqlens[n] / page_size)
    garbage_page: int         # the pool page every unused block-table entry names

    @property
    def page_size(self) -> int:
        return self.k_cache.shape[1]

    def page_indices(self, n: int) -> list[int]:
        """Pool pages of sequence n in logical order (its used block-table entries)."""
        return self.block_table[n, :self.pages[n]].tolist()


def pages_of(length: int, page_size: int) -> int:
    return -(-length // page_size)


def paged_kv(case: Case, k: torch.Tensor, v: torch.Tensor) -> PagedKV:
    """The paged form of logical k [b, skv, hk, d_qk] and v [b, skv, hk, d_v] (any strides) for a paged case."""
    if case.page_size is None:
        raise ValueError(f"paged_kv: the case is not paged (page_size=None): {case!r}")
    ps, lens = case.page_size, case.lens_kv
    pages = tuple(pages_of(n, ps) for n in lens)
    max_pages = max(1, pages_of(case.skv, ps))
    shared = min(case.shared_prefix_pages, max(pages))
    owners: list[tuple[int, int, int]] = []   # (sequence whose keys fill it, first key, keys owned) per logical page
    for p in range(shared):
        longest = max(lens)
        owners.append((lens.index(longest), p * ps, min(ps, longest - p * ps)))
    table_logical = [[-1] * max_pages for _ in lens]
    for n, count in enumerate(pages):
        for p in range(count):
            if p < shared:
                table_logical[n][p] = p
            else:
                table_logical[n][p] = len(owners)
                owners.append((n, p * ps, min(ps, lens[n] - p * ps)))
    total = len(owners) + 1                    # the last logical page is the garbage page
    gen = torch.Generator(device="cpu").manual_seed((case.seed ^ _SHUFFLE) % 2**63)
    order = torch.randperm(total, generator=gen).tolist()   # logical page i lives at pool page order[i]
    hk = k.shape[2]
    k_cache = torch.full((total, ps, hk, k.shape[3]), GARBAGE_K, dtype=k.dtype, device=k.device)
    v_cache = torch.full((total, ps, hk, v.shape[3]), GARBAGE_V, dtype=v.dtype, device=v.device)
    for i, (n, start, count) in enumerate(owners):
        k_cache[order[i], :count] = k[n, start:start + count]
        v_cache[order[i], :count] = v[n, start:start + count]
    garbage = order[total - 1]
    table = torch.tensor([[order[i] if i >= 0 else garbage for i in row] for row in table_logical],
                         dtype=torch.int32, device=k.device)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device=k.device)
    return PagedKV(k_cache, v_cache, table, cache_seqlens, pages, garbage)


def logical_kv(paged: PagedKV, skv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v [b, skv, hk, d] read back through the block table, zeros past each cache length (for tests and for
    adapters that need the gathered form)."""
    b = paged.block_table.shape[0]
    ks, vs = [], []
    for cache, out in ((paged.k_cache, ks), (paged.v_cache, vs)):
        for n in range(b):
            rows = cache[paged.block_table[n].long()].flatten(0, 1)[:skv].clone()
            rows[int(paged.cache_seqlens[n]):] = 0
            out.append(rows)
    return torch.stack(ks), torch.stack(vs)


def owned_slots(paged: PagedKV) -> torch.Tensor:
    """bool [num_pages, page_size]: True where some sequence owns the slot (its position < that sequence's length)."""
    owned = torch.zeros(paged.k_cache.shape[:2], dtype=torch.bool)
    ps = paged.page_size
    for n, length in enumerate(paged.cache_seqlens.tolist()):
        for p, page in enumerate(paged.page_indices(n)):
            owned[page, :max(0, min(ps, length - p * ps))] = True
    return owned


def shared_prefix_positions(case: Case) -> int:
    """How many leading keys every sequence shares (equal in the logical k / v): shared_prefix_pages * page_size."""
    return min(case.skv, case.shared_prefix_pages * (case.page_size or 0))


__all__ = ["GARBAGE_K", "GARBAGE_V", "PagedKV", "logical_kv", "owned_slots", "paged_kv", "pages_of",
           "shared_prefix_positions"]
