"""How a context-parallel engine splits the sequence over ranks, and the inverse that puts the pieces back.

A convention is a list of index tensors, one per rank: rank r holds the positions `parts[r]` of the token axis, in
that order. Every convention is a permutation of the axis (the concatenation of all parts holds each position
exactly once), so `unshard(shard(x)) == x`.

- contiguous (load balancing off): rank r holds [r*n/W, (r+1)*n/W).
- head_tail (torch's load balancer): the axis in 2W chunks; rank r holds chunks r and 2W-1-r.
- dual_chunk (TE's DualChunkSwap): every sequence on its own in 2W chunks; rank r holds chunks r and 2W-1-r of
  each sequence, sequence after sequence. On one sequence (bshd / sbhd) it is head_tail; on a packed thd axis it
  is applied per sequence, each padded to a multiple of 2W.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnfuzz.strategies.case import Case

CONVENTIONS = ("contiguous", "head_tail", "dual_chunk")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def contiguous(n: int, world: int) -> list[torch.Tensor]:
    """Rank r holds positions [r*n/W, (r+1)*n/W); n must be a multiple of W."""
    _need(world >= 1 and n % world == 0, f"contiguous sharding: length n={n} must be a multiple of world={world}")
    size = n // world
    return [torch.arange(r * size, (r + 1) * size) for r in range(world)]


def head_tail(n: int, world: int) -> list[torch.Tensor]:
    """Rank r holds chunks r and 2W-1-r of 2W equal chunks; n must be a multiple of 2W."""
    _need(world >= 1 and n % (2 * world) == 0,
          f"head_tail sharding: length n={n} must be a multiple of 2*world={2 * world}")
    c = n // (2 * world)
    return [torch.cat([torch.arange(r * c, (r + 1) * c), torch.arange((2 * world - 1 - r) * c, (2 * world - r) * c)])
            for r in range(world)]


def dual_chunk(lens: tuple[int, ...], world: int) -> list[torch.Tensor]:
    """TE's DualChunkSwap over sequences of lengths `lens` laid back to back: within each sequence, rank r holds
    chunks r and 2W-1-r of 2W; every length must be a multiple of 2W."""
    _need(all(n % (2 * world) == 0 for n in lens),
          f"dual_chunk sharding: every sequence length in {tuple(lens)} must be a multiple of 2*world={2 * world}")
    parts: list[list[torch.Tensor]] = [[] for _ in range(world)]
    start = 0
    for n in lens:
        for r, idx in enumerate(head_tail(n, world)):
            parts[r].append(idx + start)
        start += n
    return [torch.cat(p) if p else torch.zeros(0, dtype=torch.long) for p in parts]


def shard(x: torch.Tensor, parts: list[torch.Tensor], dim: int) -> list[torch.Tensor]:
    """The piece of x every rank holds: x's positions parts[r] along `dim`."""
    return [x.index_select(dim, idx.to(x.device)) for idx in parts]


def unshard(pieces: list[torch.Tensor], parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """Inverse of shard: put every rank's piece back at its positions along `dim`."""
    _need(len(pieces) == len(parts), f"unshard: got {len(pieces)} pieces for {len(parts)} ranks")
    for r, (p, idx) in enumerate(zip(pieces, parts)):
        _need(p.shape[dim] == idx.numel(), f"unshard: rank {r} returned {p.shape[dim]} positions along dim {dim}, "
                                           f"its shard holds {idx.numel()}")
    order = torch.cat(list(parts)).to(pieces[0].device)
    gathered = torch.cat(pieces, dim=dim)
    out = torch.empty_like(gathered)
    out.index_copy_(dim, order, gathered)
    return out


def is_permutation(parts: list[torch.Tensor], n: int) -> bool:
    """True when the parts together hold every position 0..n-1 exactly once."""
    order = torch.cat(list(parts)) if parts else torch.zeros(0, dtype=torch.long)
    return order.numel() == n and bool((order.sort().values == torch.arange(n)).all())


def padded(lens: tuple[int, ...], multiple: int) -> tuple[int, ...]:
    """Each length rounded up to a multiple (TE pads every thd sequence to a multiple of 2*cp)."""
    return tuple(-(-n // multiple) * multiple for n in lens)


@dataclass(frozen=True)
class Plan:
    """How one case is split over `world` ranks. Batched plans shard the s axis of [b, s, heads, d] (every batch row
    the same way); packed plans (thd) first pack each sequence, zero-padded to `padded_q` / `padded_kv` tokens, into
    [t, heads, d] and shard the t axis."""

    convention: str
    world: int
    packed: bool
    q_parts: tuple[torch.Tensor, ...]
    kv_parts: tuple[torch.Tensor, ...]
    padded_q: tuple[int, ...] | None = None
    padded_kv: tuple[int, ...] | None = None


def plan(convention: str, case: Case, world: int) -> Plan:
    """The plan of `convention` for `case`: thd cases are packed per sequence (dual_chunk only), others batched."""
    _need(convention in CONVENTIONS, f"convention={convention!r} is not one of {CONVENTIONS}")
    if case.layout == "thd":
        _need(convention == "dual_chunk", f"convention={convention!r} cannot shard a packed thd case; thd is "
                                          f"sharded per sequence (dual_chunk)")
        pq, pkv = padded(case.lens_q, 2 * world), padded(case.lens_kv, 2 * world)
        return Plan(convention, world, True, tuple(dual_chunk(pq, world)), tuple(dual_chunk(pkv, world)), pq, pkv)
    split = {"contiguous": contiguous, "head_tail": head_tail, "dual_chunk": lambda n, w: dual_chunk((n,), w)}
    return Plan(convention, world, False, tuple(split[convention](case.sq, world)),
                tuple(split[convention](case.skv, world)))


def pack_padded(x: torch.Tensor, lens: tuple[int, ...], padded_lens: tuple[int, ...]) -> torch.Tensor:
    """[b, s, heads, d] -> [sum(padded_lens), heads, d]: each sequence's valid tokens, then zeros to its padded
    length."""
    out = x.new_zeros(sum(padded_lens), *x.shape[2:])
    start = 0
    for n, (length, p) in enumerate(zip(lens, padded_lens)):
        out[start:start + length] = x[n, :length]
        start += p
    return out


def unpack_padded(y: torch.Tensor, lens: tuple[int, ...], padded_lens: tuple[int, ...], s: int, *,
                  dim: int = 0, fill: float = 0.0) -> torch.Tensor:
    """Inverse of pack_padded along `dim`: back to a batch axis before `dim`, `fill` past each length. For
    [t, heads, d] (dim 0) it gives [b, s, heads, d]; for an LSE [heads, t] (dim 1) it gives [b, heads, s]."""
    y = y.movedim(dim, 0)
    out = y.new_full((len(lens), s, *y.shape[1:]), fill)
    start = 0
    for n, (length, p) in enumerate(zip(lens, padded_lens)):
        out[n, :length] = y[start:start + length]
        start += p
    return out.movedim(1, dim + 1) if dim else out
