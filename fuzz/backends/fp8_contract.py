"""The FP8 part of the bring-your-own-kernel contract (fuzz/backends/custom.py): what an FP8 kernel declares, and what
it is handed and returns.

A function whose signature names q_descale, k_descale and v_descale takes FP8 cases, and only those
(strategies/fp8.py states their semantics):

    q, k, v       the encodings [b, s, heads, d] in torch.float8_e4m3fn / torch.float8_e5m2 (case.fp8), bshd; q in
                  the case's dtype where case.fp8[0] is None (an FP8 KV cache), with descales of 1
    q_descale     float32 [h]; k_descale, v_descale float32 [hk] (one value repeated where scales are per tensor),
                  or with per-page scales (case.fp8_scaling == "page", a paged case) [num_pages, hk], one per pool
                  page (the same for its KV heads)
    out_dtype     the torch dtype to return: an FP8 one (case.fp8_out) or the case's dtype
    out_descale   float32 [] where the output is FP8, else None: return sat(round(O / out_descale)) in out_dtype,
                  saturated at its largest value
    p_dtype       the FP8 dtype P is quantised to before P V (case.fp8_p), else None
    p_scale       float where P is quantised: P * p_scale rounded to p_dtype (divided back after), else None
A real value is encoding * descale. Paged cases hand k_cache / v_cache as FP8 pages (garbage in every slot no sequence
owns: K = 0, V the format's largest). The output (dequantised by the adapter where it is FP8) is graded.
A function whose signature also names dout and dout_descale runs an FP8 backward (strategies/fp8_backward.py) and is
handed FP8 cases with gradients too (a Space with fp8_grads); for those it returns (out, lse, dq, dk, dv):

    dout          dO's encoding [b, sq, h, d_v] in its FP8 dtype (case.fp8_dout); dout_descale float32 [h]
    ds_dtype      the FP8 dtype dS = scale * P o (dP - D) is rounded to before dQ = dS K and dK = dS^T Q (case.fp8_ds;
                  cuDNN's and TE's "dP"), else None; ds_scale: round(dS * ds_scale), divided back after
    p_dtype       (above) P is rounded to it, times p_scale, before dV = P^T dO too, as in the forward
    grad_dtype    the dtype of dq, dk, dv: an FP8 one (case.fp8_dqkv) or the case's dtype
    dq_descale    float32 [h], dk_descale and dv_descale [hk] where the gradients are FP8, else None: return
                  sat(round(dX / descale)) per head
`fn.fp8 = dict(formats=..., outputs=..., ps=..., scalings=..., plain_q=..., douts=..., dss=..., dqkvs=...)` narrows
what is drawn (each a tuple of the values of strategies/fp8.py and fp8_backward.py it takes; None in outputs / ps /
dss / dqkvs: the output in the dtype / P not quantised / dS kept wide / gradients in the dtype; plain_q a bool: q in
the dtype); absent: everything.
"""

from __future__ import annotations

import dataclasses

import torch

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.fp8 import FORMATS, LARGEST, SCALINGS, TORCH_FP8
from attnfuzz.strategies.materialize import TORCH_DTYPES, Tensors
from attnfuzz.strategies.paged import PagedKV, paged_kv

FP8_FIELDS = ("q_descale", "k_descale", "v_descale")
OPTIONAL = ("out_dtype", "out_descale", "p_dtype", "p_scale")
BACKWARD_FIELDS = ("dout", "dout_descale")     # named by a kernel that runs an FP8 backward
BACKWARD_OPTIONAL = ("ds_dtype", "ds_scale", "grad_dtype", "dq_descale", "dk_descale", "dv_descale")
DECLARED = {"formats": FORMATS, "outputs": (None, *FORMATS), "ps": (None, *FORMATS), "scalings": SCALINGS,
            "plain_q": True, "douts": FORMATS, "dss": (None, *FORMATS), "dqkvs": (None, *FORMATS)}


def declared(fn) -> dict:
    """What `fn.fp8` declares, every key filled in; a bad declaration raises ValueError naming the key."""
    given = getattr(fn, "fp8", None) or {}
    if not isinstance(given, dict) or set(given) - set(DECLARED):
        raise ValueError(f"fp8={given!r}: a dict with keys among {sorted(DECLARED)}")
    for key, value in given.items():
        if key == "plain_q":
            if not isinstance(value, bool):
                raise ValueError(f"fp8['plain_q']={value!r}: true or false (takes q in the case's dtype)")
            continue
        if not isinstance(value, tuple) or not value or any(v not in DECLARED[key] for v in value):
            raise ValueError(f"fp8[{key!r}]={value!r}: a non-empty tuple of {DECLARED[key]}")
    return {**DECLARED, **given}


def refusal(name: str, takes: dict, case: Case, backward: bool = False) -> str | None:
    """Why a function that takes FP8 inputs (`takes`: declared(); `backward`: it names BACKWARD_FIELDS) refuses the
    case, or None."""
    if case.fp8 is None:
        return f"{name} takes FP8 inputs only (it names {', '.join(FP8_FIELDS)})"
    if case.grads and not backward:
        return f"{name} runs no FP8 backward (name {', '.join(BACKWARD_FIELDS)} in its signature to be given one)"
    if case.grads:
        for what, value, key in (("dO format", case.fp8_dout, "douts"), ("dS format", case.fp8_ds, "dss"),
                                 ("gradient format", case.fp8_dqkv, "dqkvs")):
            if value not in takes[key]:
                return f"{name} does not take {what} {value!r} (its fp8[{key!r}] is {takes[key]})"
    if case.layout != "bshd":
        return "FP8 encodings reach a custom kernel as [b, s, h, d] (bshd)"
    if case.fp8[0] is None and not takes["plain_q"]:
        return f"{name} takes FP8 q only (its fp8['plain_q'] is False)"
    for what, values, key in (("input format", tuple(f for f in case.fp8 if f is not None), "formats"), ("output format", (case.fp8_out,), "outputs"),
                              ("P format", (case.fp8_p,), "ps"), ("scale granularity", (case.fp8_scaling,), "scalings")):
        off = [v for v in values if v not in takes[key]]
        if off:
            return f"{name} does not take {what} {off[0]!r} (its fp8[{key!r}] is {takes[key]})"
    return None


def kernel_inputs(case: Case, t: Tensors) -> tuple[list, dict]:
    """The positional q, k, v (k, v None for a paged case) and the FP8 keywords (paged ones included) for the call."""
    f = t.fp8
    kwargs = {"q_descale": f.q_descale, "k_descale": f.k_descale, "v_descale": f.v_descale,
              "out_dtype": TORCH_FP8[case.fp8_out] if case.fp8_out else TORCH_DTYPES[case.dtype],
              "out_descale": f.out_descale, "p_dtype": TORCH_FP8[case.fp8_p] if case.fp8_p else None,
              "p_scale": f.p_scale}
    if case.grads:
        kwargs.update(dout=f.dout8, dout_descale=f.dout_descale, ds_dtype=TORCH_FP8[case.fp8_ds] if case.fp8_ds else None,
                      ds_scale=f.ds_scale,
                      grad_dtype=TORCH_FP8[case.fp8_dqkv] if case.fp8_dqkv else TORCH_DTYPES[case.dtype],
                      dq_descale=f.dq_descale, dk_descale=f.dk_descale, dv_descale=f.dv_descale)
    if not case.paged:
        return [f.q8, f.k8, f.v8], kwargs
    paged = fp8_pages(case, t)
    if case.fp8_scaling == "page":
        kwargs["k_descale"], kwargs["v_descale"] = (_per_page(case, paged, d) for d in (f.k_descale, f.v_descale))
    kwargs.update(block_table=paged.block_table, k_cache=paged.k_cache, v_cache=paged.v_cache,
                  cache_seqlens=paged.cache_seqlens)
    return [f.q8, None, None], kwargs


def fp8_pages(case: Case, t: Tensors) -> PagedKV:
    """The paged cache of the case's K / V encodings, in their FP8 dtypes (garbage slots saturated to the format)."""
    paged = paged_kv(case, t.fp8.k8.float(), t.fp8.v8.float())
    fk, fv = case.fp8[1], case.fp8[2]
    return dataclasses.replace(paged, k_cache=paged.k_cache.clamp(-LARGEST[fk], LARGEST[fk]).to(TORCH_FP8[fk]),
                               v_cache=paged.v_cache.clamp(-LARGEST[fv], LARGEST[fv]).to(TORCH_FP8[fv]))


def _per_page(case: Case, paged, per_key: torch.Tensor) -> torch.Tensor:
    """[num_pages, hk] float32: each pool page's descale, read from the descale of its first key (1 for the garbage
    page)."""
    out = torch.ones(paged.k_cache.shape[0], case.hk, dtype=torch.float32, device=per_key.device)
    for n in range(case.b):
        for p, page in enumerate(paged.page_indices(n)):
            out[page] = per_key[n, p * case.page_size]
    return out


def dequantised(case: Case, t: Tensors, out: torch.Tensor) -> torch.Tensor:
    """The kernel's output as a real value: encoding * out_descale where the output is FP8, else as returned."""
    if case.fp8_out is None:
        return out
    return out.float() * t.fp8.out_descale.to(out.device)


def dequantised_grads(case: Case, t: Tensors, grads) -> list:
    """The kernel's dq, dk, dv as real values: encoding * the descale of its head where they are FP8, else as
    returned (a value that is not a tensor is passed on: the grader says what is wrong with it)."""
    if case.fp8_dqkv is None:
        return list(grads)
    return [g.float() * d.to(g.device)[None, None, :, None] if isinstance(g, torch.Tensor) and g.dim() == 4 else g
            for g, d in zip(grads, (t.fp8.dq_descale, t.fp8.dk_descale, t.fp8.dv_descale))]
