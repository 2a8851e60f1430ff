"""Deterministic tensors for a Case: the same case gives bit-identical inputs on the same device.

q, k and v are first drawn as Gaussians (the case's mean and std), and the mask, sinks and dout after them, from
`case.seed`; a value family (`case.values`) then rewrites q, k, v or the sinks in place, from a second generator
seeded from the seed, so every family keeps the Gaussian stream of the rest of the case. `scale` below is the case's
softmax scale, c = `family_channel(case)` (seed % d_qk) the channel a family writes, "the dtype" the case's dtype.

- "gaussian": as drawn.
- "probe": q = 0 and v of 0 / 1 (strategies/case.py states what that makes exact).
- "far_negative": k[..., c] = 1 on every key, and q[b, i, h, c] = round(o / scale) in the dtype, with o drawn per
  query row and head from ROW_SHIFTS (0, -96, -128, -1024; never 0 on row 0 of head 0): every logit of the row
  moves by the same shift = scale * q[b, i, h, c] (`row_shift`; |q[..., c]| <= 2^15, so a tiny custom scale
  shifts less), so the output is the unshifted row's (q[..., c] = 0) and the LSE is its LSE plus the shift. -96
  puts a row's LSE near -90 (each exp of a raw logit is an fp32 denormal, below exp(-87.3)), -128 and -1024 past -103.3, where exp of a
  raw logit is 0 in fp32 even as a denormal. (A softcap bends the shifted logits, so with one the rows are far
  negative but not a shift of the unshifted ones.)
- "anti_aligned": q[..., c] = A on every row and k[..., c] = -A on every key but one in `period` (drawn from
  ANTI_PERIODS: 4, 16, 64, or 0 for none; the phase drawn too), where it is 0; A = round(sqrt(ANTI_LOGIT / scale)):
  a key anti-aligned to the row sits ~ANTI_LOGIT (2^14) below the few aligned ones, so its weight is exactly 0,
  and a row that sees no aligned key (period 0, a causal row 0, a window, a mask) has every logit near -16384,
  past a finite start of the running maximum or a mask fill of -1e4.
- "outlier_channel": q[..., c] and k[..., c] are +-OUTLIER (256) with a drawn sign per row and key, and v[..., c]
  is OUTLIER times its Gaussian (within +-2^15, finite in fp16): the massive activations of LLMs. The raw product
  q_c k_c = +-65536 is past fp16's largest value (65504), so a q.k rounded to fp16 before the scale overflows; a
  row's keys of the other sign sit 2 * 65536 * scale below those of its own, and a row that sees none of its own
  sign has its LSE near -65536 * scale.
- "large_sink" (learnable softmax; other softmaxes keep their sinks): the sink of head h is +-SINK_SIZES (100,
  1000), drawn per head; half the query rows of each head are shifted as in far_negative by sink_h + u, u uniform
  in [-4, 4], so the huge sink weighs as much as the row's keys; the other rows keep their logits (a positive sink
  then takes nearly all the weight: output ~0; a negative one none).
- "ties": q and k rounded to integers in [-2, 2] (every q.k is then exact in any order and precision), and key j
  repeats key j % m, m drawn in 1..4: keys with the same residue have bitwise equal logits, so many keys of a row
  share its maximum (all of them when m = 1). v stays Gaussian, so the tied keys' values differ.
- "zero_rows": every query row (b, i) and every key (b, j) is, with probability 1/4 each (drawn), exactly 0 across
  its heads and channels (a zero key row: k and v). A zero query row weighs its visible keys equally; a zero key
  has logit 0 for every query.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.fp8 import FP8Inputs, quantised
from attnfuzz.strategies.fp8_backward import quantised_backward

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                "float64": torch.float64}


@dataclass(frozen=True)
class Tensors:
    """Inputs of one case. q/k/v are logical [b, s, heads, d] views in the case's dtype, with the case's memory
    format applied; `mask` is the explicit boolean mask [b, 1, sq, skv] (True = keep) or None; `sink` holds one
    logit per query head (zeros for off_by_one) or None; `alibi` holds the slopes [h] or None; `dout` is the
    output gradient [b, sq, h, d_v] when the case checks gradients. For an FP8 case q / k / v hold the dequantised
    values in float32 (exact) and `fp8` what the kernel is handed (strategies/fp8.py)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None
    sink: torch.Tensor | None
    alibi: torch.Tensor | None
    dout: torch.Tensor | None
    fp8: FP8Inputs | None = None

    def to(self, device: str | torch.device) -> Tensors:
        """The same values on `device`, in the same memory format (a stride-0 dimension stays stride 0)."""
        if torch.device(device) == self.q.device:
            return self
        moved = {name: _moved(getattr(self, name), device) for name in self.__dataclass_fields__ if name != "fp8"}
        return Tensors(**moved, fp8=self.fp8.to(device) if self.fp8 is not None else None)


def _moved(x: torch.Tensor | None, device) -> torch.Tensor | None:
    """x on `device` with its strides: `.to` keeps a dense permuted layout but would fill in an expanded one."""
    if x is None:
        return None
    for dim, (size, stride) in enumerate(zip(x.shape, x.stride())):
        if stride == 0 and size > 1:
            return _moved(x.narrow(dim, 0, 1), device).expand(x.shape)
    return x.to(device)


ROW_SHIFTS = (0.0, -96.0, -128.0, -1024.0)   # far_negative: the per-row logit shifts, drawn per row and head
ANTI_PERIODS = (0, 4, 16, 64)                # anti_aligned: one key in `period` aligned (0: none)
ANTI_LOGIT = 16384.0                         # anti_aligned: how far below the aligned keys the others sit
OUTLIER = 256.0                              # outlier_channel: the size of the outlier channel (std 1 elsewhere)
SINK_SIZES = (100.0, 1000.0)                 # large_sink: |sink|, drawn per head with its sign
Q_SHIFT_MAX = 2.0**15   # |q[..., c]| of a shifted row at most: finite in fp16 (a scale of 0.01 gets shifts / 3)
FAMILY_SEED = 0x5EED_F00D                    # the family generator's seed is the case's seed xor this


def torch_dtype(case: Case) -> torch.dtype:
    return TORCH_DTYPES[case.dtype]


# Input elements (q, k, v and dout) from which a case bound for a GPU is drawn there, by the device's generator:
# drawing 2^20 Gaussians costs a CPU core about 15 ms, more than a whole small case on an H200, and a long case
# holds up to ~3e8 of them (seconds on the CPU, then a copy). Below it every device gets the CPU's values.
DEVICE_DRAW_FROM = 1 << 20


def input_elements(case: Case) -> int:
    """How many elements draw() generates for q, k, v and dout (k and v once per drawn KV head)."""
    hk = 1 if case.memory == "expanded_kv" else case.hk
    return case.b * (case.sq * case.h * case.d_qk + case.skv * hk * (case.d_qk + case.d_v)
                     + (case.sq * case.h * case.d_v if case.grads else 0))


def draw_device(case: Case, device: str | torch.device) -> torch.device:
    """Where `case` is drawn for a run on `device`: the CPU, unless the device is not one and the case has at
    least DEVICE_DRAW_FROM input elements (then the device itself: its values are its generator's, the same on
    the same GPU model and torch version, not the CPU's)."""
    device = torch.device(device)
    if device.type != "cpu" and input_elements(case) >= DEVICE_DRAW_FROM:
        return device
    return torch.device("cpu")


def materialize(case: Case, device: str | torch.device = "cpu") -> Tensors:
    """The case's tensors from `case.seed` on `device`: drawn on the CPU and moved (so every device sees the same
    values), or drawn on the device itself for a large case (draw_device); then q, k and v laid out in the case's
    storage."""
    return with_storage(case, draw(case, draw_device(case, device)).to(device))


def with_storage(case: Case, t: Tensors) -> Tensors:
    """t with q, k and v copied into the buffers `case.storage` says (t itself when every tensor is plain)."""
    if case.storage == ("plain", "plain", "plain"):
        return t
    q, k, v = (stored(x, kind) for x, kind in zip((t.q, t.k, t.v), case.storage))
    return Tensors(q=q, k=k, v=v, mask=t.mask, sink=t.sink, alibi=t.alibi, dout=t.dout)


def stored(x, kind):
    """The values of x in a buffer of the storage `kind`, keeping x's stride order; unused elements hold NaN.
    plain: x. offset: one element into the buffer. padded_rows: each innermost (head-dim) row followed by 8 unused
    elements. strided: the innermost dim at stride 2. A stride-0 (expanded) dim stays expanded. Self-contained
    (torch only): repro scripts embed its source."""
    import torch
    if kind == "plain":
        return x
    for dim, (size, stride) in enumerate(zip(x.shape, x.stride())):
        if stride == 0 and size > 1:
            return stored(x.narrow(dim, 0, 1), kind).expand(x.shape)
    # outermost first, as the buffer holds them; a size-1 dim has no stride of its own: outermost
    order = sorted(range(x.dim()), key=lambda d: (x.shape[d] != 1, -x.stride(d), d))
    shape = [x.shape[d] for d in order]
    inner = shape[-1]
    if kind == "offset":
        buf = torch.full((x.numel() + 1,), float("nan"), dtype=x.dtype, device=x.device)
        y = buf[1:].view(shape)
    elif kind == "padded_rows":
        y = torch.full(shape[:-1] + [inner + 8], float("nan"), dtype=x.dtype, device=x.device)[..., :inner]
    elif kind == "strided":
        y = torch.full(shape[:-1] + [2 * inner], float("nan"), dtype=x.dtype, device=x.device)[..., ::2]
    else:
        raise ValueError(f"storage {kind!r} is unknown")
    y = y.permute([order.index(d) for d in range(x.dim())])
    y.copy_(x)
    return y


def probe_values(case: Case, heads: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """v of a probe case, [skv, heads, d_v] (the same for every sequence): channel c of KV head g is 1 on the keys j
    with (j + g) % d_v == c, else 0."""
    j = torch.arange(case.skv, device=device)[:, None, None]
    g = torch.arange(heads, device=device)[None, :, None]
    c = torch.arange(case.d_v, device=device)[None, None, :]
    return ((j + g) % case.d_v == c).to(torch.float32)


def family_channel(case: Case) -> int:
    """The q / k (and v, for outlier_channel) channel a value family writes."""
    return case.seed % case.d_qk


def row_shift(case: Case, t: Tensors) -> torch.Tensor | None:
    """[b, h, sq] float64: the shift every logit of a row carries through channel c (far_negative, large_sink), read
    from the tensors; None for the other families. The unshifted row is the same row with q[..., c] = 0."""
    shifted = case.values == "far_negative" or (case.values == "large_sink" and case.softmax == "learnable")
    if not shifted or case.softcap is not None:  # a softcap bends the shifted logits: no shift invariance then
        return None
    c = family_channel(case)
    return (case.softmax_scale * t.q[..., c].double() * t.k[0, 0, 0, c].double()).transpose(1, 2).cpu()


def _shift_rows(q: torch.Tensor, k: torch.Tensor, shift: torch.Tensor, c: int, scale: float) -> None:
    """Every logit of row (b, i, h) moves by about shift[b, i, h]: k[..., c] = 1, q[..., c] = shift / scale."""
    k[..., c] = 1.0
    q[..., c] = (shift.double() / scale).clamp(-Q_SHIFT_MAX, Q_SHIFT_MAX).to(q.dtype)


def _family(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None) -> None:
    """Rewrite q, k, v (views in the case's memory format, k / v with hk_drawn heads) or the sink in place as the
    case's value family says (the module's docstring)."""
    device = q.device
    gen = torch.Generator(device=device).manual_seed(case.seed ^ FAMILY_SEED)
    c, scale, family = family_channel(case), case.softmax_scale, case.values
    b, sq, h = q.shape[:3]

    def pick(options, shape) -> torch.Tensor:
        return torch.tensor(options, dtype=torch.float64, device=device)[
            torch.randint(len(options), shape, generator=gen, device=device)]

    def index(n: int) -> int:  # one integer in 0..n-1 from the family's stream
        return int(torch.randint(n, (), generator=gen, device=device))

    if family == "far_negative":
        shifts = pick(ROW_SHIFTS, (b, sq, h))
        if shifts.numel():  # the first row of the first head is always shifted: a one-row case keeps the family
            shifts[0, 0, 0] = ROW_SHIFTS[1 + index(len(ROW_SHIFTS) - 1)]
        _shift_rows(q, k, shifts, c, scale)
    elif family == "anti_aligned":
        a = torch.tensor(math.sqrt(ANTI_LOGIT / scale), dtype=torch.float64, device=device).to(q.dtype)
        period = ANTI_PERIODS[index(len(ANTI_PERIODS))]
        phase = index(period) if period else -1
        q[..., c] = a
        aligned = (torch.arange(k.shape[1], device=device) % max(period, 1) == phase)[None, :, None]
        k[..., c] = torch.where(aligned, torch.zeros((), dtype=k.dtype, device=device), -a)
    elif family == "outlier_channel":
        q[..., c] = pick((OUTLIER, -OUTLIER), q.shape[:3]).to(q.dtype)
        k[..., c] = pick((OUTLIER, -OUTLIER), k.shape[:3]).to(k.dtype)
        v[..., c % v.shape[-1]] = (v[..., c % v.shape[-1]].double() * OUTLIER).clamp(-Q_SHIFT_MAX, Q_SHIFT_MAX)
    elif family == "large_sink" and sink is not None and case.softmax == "learnable":
        sink.copy_(pick(SINK_SIZES, (h,)) * pick((1.0, -1.0), (h,)))
        u = torch.rand((b, sq, h), generator=gen, dtype=torch.float64, device=device) * 8 - 4
        shifted = torch.rand((b, sq, h), generator=gen, device=device) < 0.5
        _shift_rows(q, k, torch.where(shifted, sink.double() + u, 0.0), c, scale)
    elif family == "ties":
        period = int(torch.randint(1, 5, (), generator=gen, device=device))
        q.copy_(q.float().round().clamp(-2, 2))
        k.copy_(k.float().round().clamp(-2, 2)[:, torch.arange(k.shape[1], device=device) % period])
    elif family == "zero_rows":
        q.masked_fill_((torch.rand((b, sq), generator=gen, device=device) < 0.25)[:, :, None, None], 0.0)
        zero_keys = (torch.rand((b, k.shape[1]), generator=gen, device=device) < 0.25)[:, :, None, None]
        k.masked_fill_(zero_keys, 0.0)
        v.masked_fill_(zero_keys, 0.0)


def draw_on_cpu(case: Case) -> Tensors:
    """The case's tensors on the CPU, in its memory format (what materialize moves to the device)."""
    return draw(case, "cpu")


def draw(case: Case, device: str | torch.device) -> Tensors:
    """The case's tensors drawn on `device` by a generator of that device seeded from `case.seed`, in the case's
    memory format. On the CPU, the values every device gets (materialize); elsewhere that device's own."""
    gen = torch.Generator(device=device).manual_seed(case.seed)
    dtype = torch_dtype(case)
    draw_dtype = torch.float64 if dtype == torch.float64 else torch.float32

    def normal(shape, mean: float, std: float) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, dtype=draw_dtype, device=device) * std + mean).to(dtype)

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
        # written into the drawn tensors, so q, k and v keep the strides the memory format gives them (a copy
        # made its own strides where a dim has size 1, and TE refused the mismatched k / v of hk = 1 with "The
        # provided qkv memory layout is not supported")
        q.zero_()
        v.copy_(probe_values(case, hk_drawn, device))
    mask = None
    if case.mask_density is not None:
        mask = torch.rand((case.b, 1, case.sq, case.skv), generator=gen, device=device) < case.mask_density
    sink = None
    if case.softmax == "off_by_one":
        sink = torch.zeros(case.h, dtype=torch.float32, device=device)
    elif case.softmax == "learnable":
        sink = torch.randn(case.h, generator=gen, dtype=torch.float32, device=device)
    alibi = None
    if case.alibi_slopes is not None:
        alibi = torch.tensor(case.alibi_slopes, dtype=torch.float32, device=device)
    if case.values not in ("gaussian", "probe"):  # after every draw of the seed's stream, before KV is expanded
        _family(case, q, k, v, sink)
    shared = min(case.skv, case.shared_prefix_pages * (case.page_size or 0))
    if shared:  # a prefix whose pages every sequence shares holds the same keys in every sequence
        k[1:, :shared] = k[:1, :shared]
        v[1:, :shared] = v[:1, :shared]
    if case.memory == "expanded_kv":
        k = k.expand(case.b, case.skv, case.hk, case.d_qk)
        v = v.expand(case.b, case.skv, case.hk, case.d_v)
    dout = None
    if case.grads:  # zero on padding rows, so what a backend leaves there cannot leak into dK / dV
        dout = normal((case.b, case.sq, case.h, case.d_v), 0.0, 1.0)
        for n, sq_n in enumerate(case.lens_q):
            dout[n, sq_n:] = 0
    if case.fp8 is not None:  # the Gaussian draw encoded in FP8; the oracle reads its exact dequantised values
        q, k, v, fp8 = quantised(case, q, k, v)
        if case.fp8_dout is not None:   # an FP8 backward: dO encoded too, and its scales
            dout, fp8 = quantised_backward(case, dout, v, fp8)
        return Tensors(q=q, k=k, v=v, mask=mask, sink=sink, alibi=alibi, dout=dout, fp8=fp8)
    return Tensors(q=q, k=k, v=v, mask=mask, sink=sink, alibi=alibi, dout=dout)
