"""FP8 attention in the case language: the formats, the scales, and inputs whose FP8 encodings are exact.

A case with `fp8` set (formats of q, k, v: "e4m3" is float8_e4m3fn, largest 448; "e5m2" is float8_e5m2, largest
57344; None for q: q stays in the case's dtype, as FlashInfer's FP8 KV caches take it) hands the kernel q, k and v as
FP8 encodings plus descales: a real value is encoding * descale (an unquantised q has descales of 1). Quantisation is
outside the kernel: the encodings are drawn, so the dequantised values that the oracle reads are exact (an encoding
has at most 4 significant bits and a descale at most DESCALE_BITS, so their product is exact in float32).

- `fp8_scaling`: "tensor" (one descale per q, k, v), "head" (q one per query head, k and v one per KV head, as FA3's
  descale_q / k / v and FlashInfer's per-head scales), "page" (q one per tensor, k and v one per pool page of a paged
  KV cache; needs page_size).
- `fp8_scales`: how the descales are drawn from the seed: "unit" (all 1), "pow2" (2^-6 .. 2^2), "saturating" (each
  tensor's or group's largest |value| encoded at the format's largest: amax scaling, the data at saturation) or "any"
  (DESCALE_BITS significant bits in [2^-6, 4)). Encodings are the Gaussian draw divided by the descale, rounded to
  the format and clamped to its largest.
- `fp8_out`: the output's format where the kernel emits FP8 (None: the case's dtype). The kernel returns
  sat(round(O / out_descale)), saturated at the format's largest; the oracle's output is clamp(O, +-max * descale).
  out_descale is drawn from the largest |V|: unit 1, pow2 as above, saturating max|V| / (largest * c) with c in
  (1, 2, 4) (c > 1 saturates the rows whose output passes max|V| / c), any as above.
- `fp8_p`: the format P is quantised to before P V (cuDNN's and FA3's FP8 forward: e4m3), P times `p_scale` (1,
  256 or 448, drawn; 1 for unit scales) rounded to the format; None keeps P wider (FlashInfer's FP8 KV caches
  dequantise K and V and compute in the dtype).
FP8 cases check gradients only with an FP8 backward (fp8_dout and the fields of strategies/fp8_backward.py); they
hold Gaussian values, contiguous plain buffers and a dtype of fp16, bf16 or fp32 (the output's where fp8_out is None).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FORMATS = ("e4m3", "e5m2")
TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
LARGEST = {"e4m3": 448.0, "e5m2": 57344.0}
MANTISSA_BITS = {"e4m3": 3, "e5m2": 2}
SMALLEST = {"e4m3": 2.0**-9, "e5m2": 2.0**-16}      # the smallest positive (subnormal) value
SCALINGS = ("tensor", "head", "page")
SCALE_KINDS = ("unit", "pow2", "saturating", "any")
DTYPES = ("float16", "bfloat16", "float32")
DESCALE_BITS = 8                                     # significant bits of a drawn descale
P_SCALES = (1.0, 256.0, 448.0)
OUT_SATURATION = (1.0, 2.0, 4.0)
FP8_SEED = 0xF8F8_5EED                               # the scales' generator is seeded with the case's seed xor this


def check_fields(case, check) -> None:
    """The FP8 fields' rules (strategies/case.py calls it; `check(ok, name, value, want)` raises naming the field)."""
    check(case.fp8 is None or (isinstance(case.fp8, tuple) and len(case.fp8) == 3 and case.fp8[0] in (None, *FORMATS)
                               and all(f in FORMATS for f in case.fp8[1:])), "fp8", case.fp8,
          f"None (not FP8) or three of {FORMATS}, for q, k and v (q may be None: in the case's dtype)")
    for name in ("fp8_out", "fp8_p"):
        value = getattr(case, name)
        check(value is None or value in FORMATS, name, value, f"None or one of {FORMATS}")
        check(value is None or case.fp8 is not None, name, value, "needs fp8 set (the inputs' formats)")
    check(case.fp8_scaling in SCALINGS, "fp8_scaling", case.fp8_scaling, f"one of {SCALINGS}")
    check(case.fp8_scales in SCALE_KINDS, "fp8_scales", case.fp8_scales, f"one of {SCALE_KINDS}")
    if case.fp8 is None:
        check(case.fp8_scaling == "tensor" and case.fp8_scales == "unit", "fp8_scaling", case.fp8_scaling,
              "scales are for FP8 cases: set fp8, or leave fp8_scaling='tensor' and fp8_scales='unit'")
        return
    check(case.fp8_scaling != "page" or case.page_size is not None, "fp8_scaling", case.fp8_scaling,
          "per-page scales need a paged KV cache (page_size)")
    check(not case.grads or case.fp8_dout is not None, "grads", case.grads,
          "an FP8 case checks gradients with an FP8 backward: set fp8_dout (strategies/fp8_backward.py) or grads=false")
    check(case.dtype in DTYPES, "dtype", case.dtype, f"an FP8 case's dtype is one of {DTYPES}")
    check(case.values == "gaussian", "values", case.values, "FP8 cases draw Gaussian values (encoded exactly)")
    check(case.memory == "contiguous", "memory", case.memory, "FP8 encodings are contiguous")
    check(case.storage == ("plain",) * 3, "storage", case.storage, "FP8 encodings are in plain buffers")
    check(case.mean == (0.0, 0.0, 0.0) and case.std == (1.0, 1.0, 1.0), "std", (case.mean, case.std),
          "FP8 cases draw unit Gaussians; their range comes from the scales (fp8_scales)")


@dataclass(frozen=True)
class FP8Inputs:
    """What an FP8 kernel is handed, beside the band: encodings q8 [b, sq, h, d_qk], k8, v8 [b, skv, hk, d] in their
    formats; descales float32: q_descale [h]; k_descale, v_descale [hk] (per tensor: all equal), or for page scaling
    [b, skv, hk], the descale of each logical key (kv_page_descales gives them per pool page); out_descale [] or
    None; p_scale (a float) or None. Dequantised, x = x8 * descale, what Tensors.q / k / v hold. With an FP8
    backward (strategies/fp8_backward.py): dout8 [b, sq, h, d_v] and dout_descale [h] (Tensors.dout holds dO
    dequantised), ds_scale, and the descales of FP8 gradients, dq_descale [h], dk_descale and dv_descale [hk]."""

    q8: torch.Tensor
    k8: torch.Tensor
    v8: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor
    out_descale: torch.Tensor | None
    p_scale: float | None
    dout8: torch.Tensor | None = None
    dout_descale: torch.Tensor | None = None
    ds_scale: float | None = None
    dq_descale: torch.Tensor | None = None
    dk_descale: torch.Tensor | None = None
    dv_descale: torch.Tensor | None = None

    def to(self, device) -> FP8Inputs:
        moved = {n: (x.to(device) if isinstance(x, torch.Tensor) else x) for n, x in self.__dict__.items()}
        return FP8Inputs(**moved)


def _round_bits(x: torch.Tensor, bits: int = DESCALE_BITS) -> torch.Tensor:
    """x (positive) rounded to `bits` significant bits."""
    e = torch.floor(torch.log2(x))
    return torch.round(x / 2.0**e * 2.0 ** (bits - 1)) * 2.0 ** (e - bits + 1)


def _descales(kind: str, amax: torch.Tensor, largest: float, gen: torch.Generator) -> torch.Tensor:
    """A descale per group (amax: each group's largest |value|), float32, on amax's device: drawn from the CPU
    generator `gen` whatever that is, so a large case drawn on a GPU gets the same descales as on the CPU."""
    n, device, amax = amax.shape, amax.device, amax.cpu()
    if kind == "unit":
        d = torch.ones(n)
    elif kind == "pow2":
        d = 2.0 ** torch.randint(-6, 3, n, generator=gen).float()
    elif kind == "saturating":
        d = _round_bits((amax.double().clamp(min=2.0**-20) / largest)).float()
    else:
        d = _round_bits(2.0 ** (torch.rand(n, generator=gen, dtype=torch.float64) * 8 - 6)).float()
    return d.to(device)


def encode(x: torch.Tensor, descale: torch.Tensor, fmt: str) -> torch.Tensor:
    """x / descale rounded to `fmt`, saturated at its largest (descale broadcasts against x)."""
    y = (x.double() / descale.double()).clamp(-LARGEST[fmt], LARGEST[fmt])
    return y.to(TORCH_FP8[fmt])


def quantised(case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k, v (the case's Gaussian draw, [b, s, heads, d]) as FP8: (q, k, v dequantised in float32, FP8Inputs)."""
    gen = torch.Generator().manual_seed(case.seed ^ FP8_SEED)
    kind, scaling = case.fp8_scales, case.fp8_scaling
    fq, fk, fv = case.fp8
    per_key = scaling == "page"
    out = []
    for x, fmt, name in ((q, fq, "q"), (k, fk, "k"), (v, fv, "v")):
        if fmt is None:   # q in the case's dtype, unquantised
            out.append((x.float(), x.contiguous(), torch.ones(x.shape[2], device=x.device)))
            continue
        x = x.float()
        if scaling == "head":
            amax = x.abs().amax(dim=(0, 1, 3))                               # [heads]
            d = _descales(kind, amax, LARGEST[fmt], gen)
            full = d[None, None, :, None]
        elif per_key and name != "q":
            d = _page_descales(case, x, fmt, gen)                            # [b, skv, hk]
            full = d[..., None]
        else:
            d = _descales(kind, x.abs().amax().reshape(1), LARGEST[fmt], gen).expand(x.shape[2]).contiguous()
            full = d[None, None, :, None]
        x8 = encode(x, full, fmt)
        out.append((x8.float() * full, x8, d))
    (qr, q8, dq), (kr, k8, dk), (vr, v8, dv) = out
    out_descale = None
    if case.fp8_out is not None:
        amax_v = vr.abs().amax().reshape(1).double()
        largest = LARGEST[case.fp8_out]
        if kind == "saturating":
            c = OUT_SATURATION[int(torch.randint(len(OUT_SATURATION), (), generator=gen))]
            out_descale = _round_bits((amax_v.clamp(min=2.0**-20) / (largest * c))).float()[0]
        else:
            out_descale = _descales(kind, amax_v, largest, gen)[0]
    p_scale = None
    if case.fp8_p is not None:
        p_scale = 1.0 if kind == "unit" else P_SCALES[int(torch.randint(len(P_SCALES), (), generator=gen))]
    return qr, kr, vr, FP8Inputs(q8, k8, v8, dq, dk, dv, out_descale, p_scale)


def _page_descales(case, x: torch.Tensor, fmt: str, gen: torch.Generator) -> torch.Tensor:
    """[b, skv, hk]: the descale of each logical key, one per logical page of each sequence (the shared prefix pages,
    one set of pool pages, share theirs)."""
    ps, b, skv = case.page_size, x.shape[0], x.shape[1]
    pages = -(-skv // ps)
    amax = x.abs().amax(dim=(2, 3))                                          # [b, skv]
    amax = torch.nn.functional.pad(amax, (0, pages * ps - skv)).reshape(b, pages, ps).amax(-1)
    d = _descales(case.fp8_scales, amax.flatten(), LARGEST[fmt], gen).reshape(b, pages)
    shared = min(case.shared_prefix_pages, pages)
    if shared:
        d[1:, :shared] = d[:1, :shared]
    return d.repeat_interleave(ps, dim=1)[:, :skv, None].expand(b, skv, x.shape[2]).contiguous()


def saturate(case, out: torch.Tensor, fp8: FP8Inputs | None) -> torch.Tensor:
    """The output as an FP8 output holds it before rounding: clamped to +-largest * out_descale (out unchanged where
    the case's output is not FP8)."""
    if case.fp8_out is None or fp8 is None or fp8.out_descale is None:
        return out
    limit = LARGEST[case.fp8_out] * float(fp8.out_descale)
    return out.clamp(-limit, limit)


def spacing(fmt: str) -> tuple[float, float]:
    """(u, s): a value of `fmt` rounds to within u * |x| (normal) or s (subnormal, absolute) of x."""
    return 2.0 ** -(MANTISSA_BITS[fmt] + 1), SMALLEST[fmt] / 2


def fp8_class(case) -> str:
    """The FP8 feature: off, e4m3 (all three), e5m2 (all three), mixed, kv (q unquantised)."""
    if case.fp8 is None:
        return "off"
    if case.fp8[0] is None:
        return "kv"
    return case.fp8[0] if len(set(case.fp8)) == 1 else "mixed"
