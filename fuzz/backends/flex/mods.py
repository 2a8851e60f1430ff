"""flex_attention's mask_mods and score_mods for a case, each a small closure named for its parameters: the bands,
padding, an explicit mask, documents of a packed (thd) batch, softcap and ALiBi, and how they combine. Shared by the
adapter's run() and its repro writer."""

from __future__ import annotations

import torch

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors


def _named(fn, name: str):
    fn.__name__ = fn.__qualname__ = name
    return fn


# -- mask_mods and score_mods ------------------------------------------------------------------------------------------
def band_left(left: torch.Tensor, off: torch.Tensor):
    """Query i sees key j iff j >= i + off[b] - left."""
    return _named(lambda b, h, q_idx, kv_idx: kv_idx >= q_idx + off[b] - left, f"band_left({int(left)})")


def band_right(right: torch.Tensor, off: torch.Tensor):
    """Query i sees key j iff j <= i + off[b] + right."""
    return _named(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + off[b] + right, f"band_right({int(right)})")


def padding(lens_q: torch.Tensor, lens_kv: torch.Tensor):
    """Query i sees key j iff i < lens_q[b] and j < lens_kv[b]."""
    return _named(lambda b, h, q_idx, kv_idx: (q_idx < lens_q[b]) & (kv_idx < lens_kv[b]),
                  f"padding(q={lens_q.tolist()}, kv={lens_kv.tolist()})")


def query_padding(lens_q: torch.Tensor):
    """Query i sees keys iff i < lens_q[b] (keys past a cache are bounded elsewhere: PagedAttention's kv_len)."""
    return _named(lambda b, h, q_idx, kv_idx: q_idx < lens_q[b], f"query_padding({lens_q.tolist()})")


def explicit(mask: torch.Tensor):
    """Query i sees key j iff mask[b, 0, i, j]."""
    return _named(lambda b, h, q_idx, kv_idx: mask[b, 0, q_idx, kv_idx],
                  f"explicit(density={mask.float().mean().item():.2f})")


def all_of(*mods):
    """Query i sees key j iff every mask_mod says so."""
    def mask_mod(b, h, q_idx, kv_idx):
        keep = mods[0](b, h, q_idx, kv_idx)
        for mod in mods[1:]:
            keep = keep & mod(b, h, q_idx, kv_idx)
        return keep
    return _named(mask_mod, " & ".join(m.__name__ for m in mods))


def softcap(cap: torch.Tensor):
    """s -> cap * tanh(s / cap)."""
    return _named(lambda s, b, h, q_idx, kv_idx: cap * torch.tanh(s / cap), f"softcap({cap.item():g})")


def alibi(slopes: torch.Tensor, off: torch.Tensor):
    """s -> s - slopes[h] * |i + off[b] - j|."""
    return _named(lambda s, b, h, q_idx, kv_idx: s - slopes[h] * (q_idx + off[b] - kv_idx).abs(),
                  f"alibi({[round(x, 4) for x in slopes.tolist()]})")


def masked_scores(mask_mod):
    """s -> s where the mask_mod keeps the key, -inf elsewhere (masking without a block mask)."""
    return _named(lambda s, b, h, q_idx, kv_idx: torch.where(mask_mod(b, h, q_idx, kv_idx), s, float("-inf")),
                  f"masked({mask_mod.__name__})")


def documents(mod, doc_q, doc_kv, start_q, start_kv, sq: int, skv: int):
    """Packed sequences (thd): query i sees key j iff both belong to sequence n = doc_q[i] and `mod` (None: any) sees
    them at their positions in n. Positions are clamped so a pair across sequences still indexes in range."""
    def mask_mod(b, h, q_idx, kv_idx):
        n = doc_q[q_idx]
        same = n == doc_kv[kv_idx]
        if mod is None:
            return same
        return same & mod(n, h, (q_idx - start_q[n]).clamp(0, sq - 1), (kv_idx - start_kv[n]).clamp(0, skv - 1))
    return _named(mask_mod, f"documents({mod.__name__ if mod is not None else 'all'})")


def per_document(mod, doc_q, doc_kv, start_q, start_kv, sq: int, skv: int):
    """A score_mod applied at positions within the query's packed sequence."""
    def score_mod(s, b, h, q_idx, kv_idx):
        n = doc_q[q_idx]
        return mod(s, n, h, (q_idx - start_q[n]).clamp(0, sq - 1), (kv_idx - start_kv[n]).clamp(0, skv - 1))
    return _named(score_mod, f"per_document({mod.__name__})")


def chain(*mods):
    """The score_mods applied in order (the case language's order: softcap, then ALiBi, then the mask)."""
    def score_mod(s, b, h, q_idx, kv_idx):
        for mod in mods:
            s = mod(s, b, h, q_idx, kv_idx)
        return s
    return _named(score_mod, " -> ".join(m.__name__ for m in mods))


def document_index(case: Case, device):
    """(sequence of each packed query, of each packed key, first packed query of each sequence, first key)."""
    lens_q, lens_kv = torch.tensor(case.lens_q), torch.tensor(case.lens_kv)
    seqs = torch.arange(case.b)
    return (torch.repeat_interleave(seqs, lens_q).to(device), torch.repeat_interleave(seqs, lens_kv).to(device),
            (lens_q.cumsum(0) - lens_q).to(device), (lens_kv.cumsum(0) - lens_kv).to(device))


def has_mask(case: Case) -> bool:
    return case.left is not None or case.right is not None or case.padded or case.mask_density is not None


def mods_of(case: Case, tensors: Tensors, device, *, key_padding: bool = True):
    """(the mask_mod, or None when nothing is masked; the score_mods in the case's order). Without `key_padding`
    the mask leaves keys past each sequence's length to the caller (a paged cache's own length bound)."""
    lens_q = torch.tensor(case.lens_q, device=device)
    lens_kv = torch.tensor(case.lens_kv, device=device)
    off = lens_kv - lens_q if case.alignment == "bottom_right" else torch.zeros_like(lens_q)
    masks = []
    if case.left is not None:
        masks.append(band_left(torch.tensor(case.left, device=device), off))
    if case.right is not None:
        masks.append(band_right(torch.tensor(case.right, device=device), off))
    if case.padded and key_padding:
        masks.append(padding(lens_q, lens_kv))
    elif case.lens_q != (case.sq,) * case.b:
        masks.append(query_padding(lens_q))
    if tensors.mask is not None:
        masks.append(explicit(tensors.mask.to(device)))
    score_dtype = torch.float64 if case.dtype == "float64" else torch.float32
    mods = []
    if case.softcap is not None:
        mods.append(softcap(torch.tensor(case.softcap, dtype=score_dtype, device=device)))
    if tensors.alibi is not None:
        mods.append(alibi(tensors.alibi.to(device), off))
    return (all_of(*masks) if masks else None), mods
