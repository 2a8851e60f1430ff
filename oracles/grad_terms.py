"""The reference's per-row gradient terms, accumulated one chunk of queries at a time (oracles/reference.py): the
squared terms a fused backward rounds, the D terms, and the sums an FP8 backward's roundings scale with."""

from __future__ import annotations

import torch

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import torch_dtype

FP8_TERMS = ("dq_ds", "dq_seen", "dq_p", "dk_ds", "dk_seen", "dk_p", "dv_seen")


def _grouped(case: Case, x: torch.Tensor) -> torch.Tensor:
    """[j, h, d] -> [j, hk, d]: a GQA group's query heads summed (query head i reads KV head i // g)."""
    return x.unflatten(1, (case.hk, case.h // case.hk)).sum(2)


def add_fp8_terms(case: Case, acc: dict, n: int, r0: int, r1: int, scale: float, ds: torch.Tensor, p: torch.Tensor,
                  q: torch.Tensor, k: torch.Tensor, dout: torch.Tensor) -> None:
    """Adds one chunk of queries' FP8 backward sums (rows r0..r1 of sequence n; oracles/fp8_grads.py), per channel:
    sum_j |scale dS_ij| |K_j| ("dq_ds"), sum_j over the keys row i weighs |K_j| ("dq_seen") and sum_j P_ij |K_j|
    ("dq_p"); per key, over the queries and a GQA group's heads, sum_i |scale dS_ij| |Q_i| ("dk_ds"), sum_i over the
    queries that weigh key j |Q_i| ("dk_seen"), sum_i P_ij |Q_i| ("dk_p") and sum_i over them |dO_i| ("dv_seen").
    ds (the logits' gradient), p [h, r, j]; q [r, h, d]; k [j, h or hk, d]; dout [r, h, d_v]."""
    k = k.repeat_interleave(case.h // case.hk, dim=1) if k.shape[1] != case.h else k
    ds_abs, seen, p = (ds.detach() * scale).abs(), (p > 0).to(p.dtype), p.detach()
    qa, ka, skv_n = q.abs(), k.abs(), p.shape[-1]
    for name, w in (("ds", ds_abs), ("seen", seen), ("p", p)):
        acc[f"dq_{name}"][n, r0:r1] = torch.einsum("hrj,jhd->rhd", w, ka)
        acc[f"dk_{name}"][n, :skv_n] += _grouped(case, torch.einsum("hrj,rhd->jhd", w, qa))
    acc["dv_seen"][n, :skv_n] += _grouped(case, torch.einsum("hrj,rhd->jhd", seen, dout.abs()))


def equal_counts(x: torch.Tensor) -> torch.Tensor:
    """How many elements of its row (the last dim) hold the same value as each element of `x`, taken in fp32."""
    if x.shape[-1] == 0:
        return torch.ones_like(x)
    ordered, order = x.float().sort(-1)
    run = torch.cat([torch.zeros_like(ordered[..., :1], dtype=torch.long),
                     (ordered[..., 1:] != ordered[..., :-1]).long().cumsum(-1)], -1)
    sizes = torch.zeros_like(run).scatter_add_(-1, run, torch.ones_like(run))
    return torch.empty_like(run).scatter_(-1, order, sizes.gather(-1, run)).to(x.dtype)


def repeats_rows(x: torch.Tensor) -> bool:
    """Whether two rows of one head of x [n, heads, d] hold the same values (V's: where a row's dS can repeat)."""
    n, heads = x.shape[:2]
    if n < 2:
        return False
    head = torch.arange(heads, device=x.device, dtype=x.dtype).expand(n, heads)[..., None]
    return torch.unique(torch.cat([head, x], -1).reshape(n * heads, -1), dim=0).shape[0] < n * heads


def add_grad_terms(case: Case, acc: dict, n: int, r0: int, r1: int, scale: float, ds: torch.Tensor, p: torch.Tensor,
                    q: torch.Tensor, k: torch.Tensor, dout: torch.Tensor, equal_ds: bool = True) -> None:
    """Adds one chunk of queries' squared gradient terms (rows r0..r1 of sequence n) to `acc`, per channel:
    (scale dS_ij K_jc)^2 summed over keys ("dq"), (scale dS_ij Q_ic)^2 and (P_ij dO_ic)^2 summed over queries and a
    GQA group's heads ("dk", "dv"). ds (the logits' gradient), p [h, r, j]; q [r, h, d]; k [j, h or hk, d];
    dout [r, h, d_v].
    A row's equal dS_ij round alike, so their roundings add up rather than walk: a dQ term whose dS_ij c keys of the
    row share counts c times (by Cauchy-Schwarz, (sum of c equal roundings times K_jc)^2 is at most c times the sum
    of their squares). Probe values weigh every key alike and give V d_v distinct rows, so a row's dS takes d_v
    values; over keys near 3 (a K mean of 3) FlashAttention's algorithm written out read 1.9x over without it (bf16,
    1,024 queries over 11,905 keys), an sdpa-cudnn kernel on an H100 1.73x. dK and dV sum over queries, whose dS_ij
    differ with dO_i: no value family draws equal dO rows. `equal_ds=False` skips the count, which sorts every
    row of dS: the reference asks it only where V repeats rows (repeats_rows), as probe values do."""
    ds2, hk = (ds.detach() * scale).square(), case.hk
    k = k.repeat_interleave(case.h // hk, dim=1) if k.shape[1] != case.h else k
    acc["dq"][n, r0:r1] = torch.einsum("hrj,jhd->rhd", ds2 * equal_counts(ds.detach()) if equal_ds else ds2,
                                       k.square())

    def grouped(x: torch.Tensor) -> torch.Tensor:  # [j, h, d] -> [j, hk, d]: query head i reads KV head i // g
        return x.unflatten(1, (hk, case.h // hk)).sum(2)
    skv_n = ds.shape[-1]
    acc["dk"][n, :skv_n] += grouped(torch.einsum("hrj,rhd->jhd", ds2, q.square()))
    acc["dv"][n, :skv_n] += grouped(torch.einsum("hrj,rhd->jhd", p.square(), dout.square()))


def add_d_terms(case: Case, acc: dict, n: int, r0: int, r1: int, p: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 out: torch.Tensor, dout: torch.Tensor, rms: torch.Tensor) -> None:
    """Adds one chunk of queries' D terms (rows r0..r1 of sequence n) to `acc`: how far a shift of D_i =
    rowsum(dO_i * O_i) moves dQ row i ("moves", |sum_j P_ij K_j|, max over channels), the size R_i of the shift a
    rounded output gives ("size"), R_i |Q_i| summed over the queries of each key, per channel ("dk"), and each key's
    P mass ("mass"). p [h, r, j];
    q [r, h, d]; k [j, h or hk, d]; out, dout [r, h, d_v]; rms [r, h] (attend's)."""
    hk, u = case.hk, torch.finfo(torch_dtype(case)).eps / 2
    k = k.repeat_interleave(case.h // hk, dim=1) if k.shape[1] != case.h else k
    # with a softcap, dS_ij carries tanh' (in (0, 1]) too, so the signed sum bounds it no more: sum_j P_ij |K_j| does
    acc["moves"][n, r0:r1] = torch.einsum("hrj,jhd->rhd", p, k if case.softcap is None else k.abs()).abs().amax(-1)
    # R_i: what D_i = sum_c dO_ic O_ic moves by when each O_ic the kernel stored is off by its final rounding, u |O_ic|,
    # plus u rms_i for P rounded before P V (FlashAttention's forward, torch's CPU flash kernel), plus the output
    # floor's 1e-7 absolute, so no row's is 0. It only weighs the rows against each other: the grade scales it by the
    # largest |dD_i| / R_i a kernel shows (oracles/grade.py, d_inherited), so a poor guess loosens dK, never fails it.
    rms = rms[..., None] if rms is not None else 0.0
    size = (dout.abs() * (u * (out.abs() + rms) + 1e-7)).sum(-1)                 # [r, h]
    acc["size"][n, r0:r1] = size
    acc["dk"][n, :p.shape[-1]] += torch.einsum("hrj,rhd->jhd", p, size[..., None] * q.abs()).unflatten(
        1, (hk, case.h // hk)).sum(2)
    acc["mass"][n, :p.shape[-1]] += p.sum(1).T.unflatten(1, (hk, case.h // hk)).sum(2)
