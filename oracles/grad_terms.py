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


def add_grad_terms(case: Case, acc: dict, n: int, r0: int, r1: int, scale: float, ds: torch.Tensor, p: torch.Tensor,
                    q: torch.Tensor, k: torch.Tensor, dout: torch.Tensor) -> None:
    """Adds one chunk of queries' squared gradient terms (rows r0..r1 of sequence n) to `acc`, per channel:
    (scale dS_ij K_jc)^2 summed over keys ("dq"), (scale dS_ij Q_ic)^2 and (P_ij dO_ic)^2 summed over queries and a
    GQA group's heads ("dk", "dv"). ds (the logits' gradient), p [h, r, j]; q [r, h, d]; k [j, h or hk, d];
    dout [r, h, d_v]."""
    ds2, hk = (ds.detach() * scale).square(), case.hk
    k = k.repeat_interleave(case.h // hk, dim=1) if k.shape[1] != case.h else k
    acc["dq"][n, r0:r1] = torch.einsum("hrj,jhd->rhd", ds2, k.square())

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
