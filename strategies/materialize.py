"""Deterministic tensors for a Case: the same case gives bit-identical inputs on the same device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnfuzz.strategies.case import Case

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                "float64": torch.float64}


@dataclass(frozen=True)
class Tensors:
    """Inputs of one case. q/k/v are logical [b, s, heads, d] views in the case's dtype, with the case's memory
    format applied; `mask` is the explicit boolean mask [b, 1, sq, skv] (True = keep) or None; `sink` holds one
    logit per query head (zeros for off_by_one) or None; `alibi` holds the slopes [h] or None; `dout` is the
    output gradient [b, sq, h, d_v] when the case checks gradients."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None
    sink: torch.Tensor | None
    alibi: torch.Tensor | None
    dout: torch.Tensor | None

    def to(self, device: str | torch.device) -> Tensors:
        """The same values on `device`, in the same memory format (a stride-0 dimension stays stride 0)."""
        if torch.device(device) == self.q.device:
            return self
        moved = {name: _moved(getattr(self, name), device) for name in self.__dataclass_fields__}
        return Tensors(**moved)


def _moved(x: torch.Tensor | None, device) -> torch.Tensor | None:
    """x on `device` with its strides: `.to` keeps a dense permuted layout but would fill in an expanded one."""
    if x is None:
        return None
    for dim, (size, stride) in enumerate(zip(x.shape, x.stride())):
        if stride == 0 and size > 1:
            return _moved(x.narrow(dim, 0, 1), device).expand(x.shape)
    return x.to(device)


def torch_dtype(case: Case) -> torch.dtype:
    return TORCH_DTYPES[case.dtype]


def materialize(case: Case, device: str | torch.device = "cpu") -> Tensors:
    """Draw the case's tensors from `case.seed` on the CPU, then move them to `device` (so every device sees the
    same values)."""
    return draw_on_cpu(case).to(device)


def probe_values(case: Case, heads: int, head_major: bool) -> torch.Tensor:
    """v of a probe case: channel c of KV head g is 1 on the keys j with (j + g) % d_v == c, else 0."""
    j = torch.arange(case.skv)[:, None, None]
    g = torch.arange(heads)[None, :, None]
    c = torch.arange(case.d_v)[None, None, :]
    v = ((j + g) % case.d_v == c).to(torch.float32).expand(case.b, -1, -1, -1).contiguous()
    return v.transpose(1, 2).contiguous().transpose(1, 2) if head_major else v


def draw_on_cpu(case: Case) -> Tensors:
    """The case's tensors on the CPU, in its memory format (what materialize moves to the device)."""
    gen = torch.Generator(device="cpu").manual_seed(case.seed)
    dtype = torch_dtype(case)
    draw_dtype = torch.float64 if dtype == torch.float64 else torch.float32

    def normal(shape, mean: float, std: float) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, dtype=draw_dtype) * std + mean).to(dtype)

    hk_drawn = 1 if case.memory == "expanded_kv" else case.hk
    head_major = case.memory == "transposed"

    def qkv(s: int, heads: int, d: int, mean: float, std: float) -> torch.Tensor:
        if head_major:
            return normal((case.b, heads, s, d), mean, std).transpose(1, 2)
        return normal((case.b, s, heads, d), mean, std)

    q = qkv(case.sq, case.h, case.d_qk, case.mean[0], case.std[0])
    k = qkv(case.skv, hk_drawn, case.d_qk, case.mean[1], case.std[1])
    v = qkv(case.skv, hk_drawn, case.d_v, case.mean[2], case.std[2])
    if case.values == "probe":  # drawn all the same, so the rest of the stream (mask, sink, dout) is the seed's
        q, v = q.zero_(), probe_values(case, hk_drawn, head_major).to(dtype)
    shared = min(case.skv, case.shared_prefix_pages * (case.page_size or 0))
    if shared:  # a prefix whose pages every sequence shares holds the same keys in every sequence
        k[1:, :shared] = k[:1, :shared]
        v[1:, :shared] = v[:1, :shared]
    if case.memory == "expanded_kv":
        k = k.expand(case.b, case.skv, case.hk, case.d_qk)
        v = v.expand(case.b, case.skv, case.hk, case.d_v)
    mask = None
    if case.mask_density is not None:
        mask = torch.rand((case.b, 1, case.sq, case.skv), generator=gen) < case.mask_density
    sink = None
    if case.softmax == "off_by_one":
        sink = torch.zeros(case.h, dtype=torch.float32)
    elif case.softmax == "learnable":
        sink = torch.randn(case.h, generator=gen, dtype=torch.float32)
    alibi = None
    if case.alibi_slopes is not None:
        alibi = torch.tensor(case.alibi_slopes, dtype=torch.float32)
    dout = None
    if case.grads:  # zero on padding rows, so what a backend leaves there cannot leak into dK / dV
        dout = normal((case.b, case.sq, case.h, case.d_v), 0.0, 1.0)
        for n, sq_n in enumerate(case.lens_q):
            dout[n, sq_n:] = 0
    return Tensors(q=q, k=k, v=v, mask=mask, sink=sink, alibi=alibi, dout=dout)
