"""The case language: one attention problem, small, frozen, JSON-round-trippable, holding no tensors.

Semantics (the oracle grades every backend against these):

- q [b, sq, h, d_qk], k [b, skv, hk, d_qk], v [b, skv, hk, d_v]; query head i reads KV head i // (h // hk).
- Sequence n has sq_n = seqlens_q[n] valid queries and skv_n = seqlens_kv[n] valid keys (all of sq / skv when the
  seqlens are None). Query i sees key j iff i < sq_n, j < skv_n and  i + off - left <= j <= i + off + right,
  with off = 0 (top_left) or skv_n - sq_n (bottom_right); a None bound is unbounded; causal means right = 0.
  An explicit boolean mask (density `mask_density`, drawn from the seed) is ANDed in.
- scores = scale * q.k (scale None means 1/sqrt(d_qk)), then softcap c*tanh(s/c), then ALiBi -slope*|i + off - j|,
  then the mask, then softmax whose denominator also holds exp(sink) (off_by_one: sink = 0; learnable: one sink
  logit per head, drawn from the seed), then times v.
- A valid query row with no visible key has output 0 and LSE log(exp(sink)) (-inf for vanilla softmax).
- Query rows past sq_n (padding) are not graded.
- `values` says what q, k and v hold: "gaussian" (normal draws of the case's mean and std) or "probe": q = 0, so
  every visible key of a row gets the same weight (logits are exactly 0 in any precision) and the LSE is
  log(count + exp(sink)); k is drawn as for "gaussian"; v holds 0 and 1, channel c of KV head g is 1 on the keys j
  with (j + g) % d_v == c. A row's output in channel c is then the share of its visible keys in that residue class:
  0 exactly where it sees none, and one key more or less moves it by ~1/count_c, far beyond rounding.
  The value families (FAMILIES: far_negative, anti_aligned, outlier_channel, large_sink, ties, zero_rows) rewrite the
  Gaussian draw into the patterns that reach extreme logits: rows shifted far below zero, anti-aligned keys, one
  outlier channel, sinks of +-100 and more, exact ties at the row maximum, all-zero rows (strategies/materialize.py).
- `page_size` (None: not paged) says the keys reach the backend as a paged KV cache, as serving kernels hold it: a
  pool of pages of `page_size` slots, shuffled from the seed, a block table per sequence and a cache length per
  sequence (= seqlens_kv); slots no sequence owns hold garbage (strategies/paged.py). The first
  `shared_prefix_pages` pages are one set of pool pages shared by every sequence (their keys are the same in the
  logical k / v). The oracle reads the logical k / v only: the semantics above do not change. Decode is the same
  semantics with few queries, bottom-right aligned. Paged cases are forward-only (grads false).

`layout` and `memory` say how the same logical tensors reach the backend (bshd / sbhd / packed thd; contiguous,
head-major transposed views, or one KV head expanded with stride 0); `storage` says, per tensor (q, k, v), how its
buffer is laid out around those strides: "plain" as the memory format gives it, "offset" one element into its
buffer, "padded_rows" each head-dim row followed by ROW_PAD unused elements, "strided" every other element of the
head dim (its stride 2); the unused elements hold NaN (strategies/materialize.py). Storage other than plain is
for bshd cases without a paged cache (the adapters build sbhd, thd and paged buffers themselves); `spelling` names how the adapter spells the
mask in its API ("" is the adapter's default): equivalent spellings must agree, so the spelling is fuzzed too.
`fp8` (None: not FP8) and the fp8_* fields hand the kernel q, k and v as FP8 encodings and descales, maybe taking an FP8
output and rounding P to FP8 (strategies/fp8.py states their semantics); the oracle reads the exact dequantised values.
With grads, `fp8_dout`, `fp8_ds` and `fp8_dqkv` say how the FP8 backward is quantised (strategies/fp8_backward.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from attnfuzz.strategies import fp8, fp8_backward

DTYPES = ("float16", "bfloat16", "float32", "float64")
ALIGNMENTS = ("top_left", "bottom_right")
SOFTMAXES = ("vanilla", "off_by_one", "learnable")
LAYOUTS = ("bshd", "sbhd", "thd")
MEMORY = ("contiguous", "transposed", "expanded_kv")
VALUES = ("gaussian", "probe")
# Value families that reach extreme logits (strategies/materialize.py says what each holds)
FAMILIES = ("far_negative", "anti_aligned", "outlier_channel", "large_sink", "ties", "zero_rows")
# How one tensor's buffer is laid out (the plainest first: shrinking goes toward it); `storage` holds one per q, k, v
STORAGES = ("plain", "offset", "padded_rows", "strided")
PLAIN_STORAGE = ("plain", "plain", "plain")
# Fields added after cases were saved: left out of to_dict() at their default, so every saved case, corpus
# signature (a hash of to_dict()), repro script and campaign log of before keeps its bytes.
OMITTED_AT_DEFAULT = ("values", "page_size", "shared_prefix_pages", "storage", "fp8", "fp8_out", "fp8_p", "fp8_scaling",
                      "fp8_scales", "fp8_dout", "fp8_ds", "fp8_dqkv")
SCHEMA = 1


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(ok: bool, name: str, value, want: str) -> None:
    if not ok:
        raise ValueError(f"Case: invalid {name}={value!r}: {want}")


@dataclass(frozen=True)
class Case:
    """One attention problem. Construct with keywords; every field is validated, naming the field on error."""

    b: int = 1
    sq: int = 16
    skv: int = 16
    h: int = 1
    hk: int = 1
    d_qk: int = 16
    d_v: int = 16
    dtype: str = "float32"
    seqlens_q: tuple[int, ...] | None = None
    seqlens_kv: tuple[int, ...] | None = None
    causal: bool = False
    window: tuple[int | None, int | None] = (None, None)
    alignment: str = "top_left"
    mask_density: float | None = None
    scale: float | None = None
    softcap: float | None = None
    alibi_slopes: tuple[float, ...] | None = None
    softmax: str = "vanilla"
    layout: str = "bshd"
    memory: str = "contiguous"
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    seed: int = 0
    grads: bool = False
    spelling: str = ""
    values: str = "gaussian"
    page_size: int | None = None
    shared_prefix_pages: int = 0
    storage: tuple[str, str, str] = PLAIN_STORAGE
    fp8: tuple[str, str, str] | None = None   # FP8 inputs: the formats of q, k, v (strategies/fp8.py); None: not FP8
    fp8_out: str | None = None
    fp8_p: str | None = None
    fp8_scaling: str = "tensor"
    fp8_scales: str = "unit"
    fp8_dout: str | None = None   # an FP8 backward: dO's format, dS's and the gradients' (strategies/fp8_backward.py)
    fp8_ds: str | None = None
    fp8_dqkv: str | None = None

    def __post_init__(self) -> None:
        for name in ("causal", "grads"):  # JSON's "yes" or 1 is not a switch: a corpus entry must say true or false
            _check(isinstance(getattr(self, name), bool), name, getattr(self, name), "true or false")
        for name in ("dtype", "alignment", "softmax", "layout", "memory", "spelling", "values"):
            _check(isinstance(getattr(self, name), str), name, getattr(self, name), "a string")
        for name in ("mask_density", "scale", "softcap"):
            value = getattr(self, name)
            _check(value is None or _is_number(value), name, value, "None or a number")
        for name in ("alibi_slopes", "mean", "std"):
            value = getattr(self, name)
            _check(value is None or (isinstance(value, tuple) and all(map(_is_number, value))), name, value,
                   "None or a list of numbers")
        for name in ("b", "sq", "skv", "h", "hk", "d_qk", "d_v"):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name, value,
                   "must be an int >= 1")
        _check(self.h % self.hk == 0, "hk", self.hk, f"h={self.h} must be a multiple of hk")
        _check(self.dtype in DTYPES, "dtype", self.dtype, f"one of {DTYPES}")
        _check(self.alignment in ALIGNMENTS, "alignment", self.alignment, f"one of {ALIGNMENTS}")
        _check(self.softmax in SOFTMAXES, "softmax", self.softmax, f"one of {SOFTMAXES}")
        _check(self.layout in LAYOUTS, "layout", self.layout, f"one of {LAYOUTS}")
        _check(self.memory in MEMORY, "memory", self.memory, f"one of {MEMORY}")
        _check(self.values in VALUES + FAMILIES, "values", self.values, f"one of {VALUES + FAMILIES}")
        for name, full in (("seqlens_q", self.sq), ("seqlens_kv", self.skv)):
            lens = getattr(self, name)
            if lens is None:
                continue
            _check(isinstance(lens, tuple) and len(lens) == self.b, name, lens, f"a tuple of b={self.b} ints")
            _check(all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= full for n in lens), name, lens,
                   f"each length in 0..{full} ({'sq' if name == 'seqlens_q' else 'skv'})")
        _check(self.layout != "thd" or (self.seqlens_q is not None and self.seqlens_kv is not None), "layout",
               self.layout, "thd (packed) needs seqlens_q and seqlens_kv; give them or use bshd/sbhd")
        _check(isinstance(self.window, tuple) and len(self.window) == 2, "window", self.window,
               "a pair (left, right) of int >= 0 or None")
        _check(all(w is None or (isinstance(w, int) and not isinstance(w, bool) and w >= 0) for w in self.window),
               "window", self.window,
               "bounds are ints >= 0, or None for unbounded")
        _check(not self.causal or self.window[1] in (None, 0), "window", self.window,
               "causal means right = 0; use causal=False with window=(left, right) for a band")
        _check(self.mask_density is None or 0.0 <= self.mask_density <= 1.0, "mask_density", self.mask_density,
               "None, or the probability in [0, 1] that a key is kept by the explicit boolean mask")
        _check(self.scale is None or (math.isfinite(self.scale) and self.scale > 0), "scale", self.scale,
               "None (1/sqrt(d_qk)) or a finite float > 0")
        _check(self.softcap is None or (math.isfinite(self.softcap) and self.softcap > 0), "softcap", self.softcap,
               "None or a finite float > 0")
        _check(self.alibi_slopes is None or (isinstance(self.alibi_slopes, tuple) and len(self.alibi_slopes) == self.h
                                             and all(s >= 0 for s in self.alibi_slopes)),
               "alibi_slopes", self.alibi_slopes, f"None or a tuple of h={self.h} slopes >= 0")
        _check(self.memory != "expanded_kv" or self.hk > 1 or self.h == 1, "memory", self.memory,
               "expanded_kv expands one KV head over hk heads with stride 0; it needs hk > 1")
        for name in ("mean", "std"):
            value = getattr(self, name)
            _check(isinstance(value, tuple) and len(value) == 3 and all(math.isfinite(x) for x in value), name,
                   value, "a tuple of three finite floats for (q, k, v)")
        _check(all(s >= 0 for s in self.std), "std", self.std, "standard deviations must be >= 0")
        _check(self.page_size is None or (isinstance(self.page_size, int) and not isinstance(self.page_size, bool)
                                          and self.page_size >= 1), "page_size", self.page_size,
               "None (not paged) or an int >= 1, the slots per page of the paged KV cache")
        _check(isinstance(self.shared_prefix_pages, int) and not isinstance(self.shared_prefix_pages, bool)
               and self.shared_prefix_pages >= 0, "shared_prefix_pages", self.shared_prefix_pages, "an int >= 0")
        _check(self.shared_prefix_pages == 0 or (self.page_size is not None
                                                 and self.shared_prefix_pages * self.page_size <= self.skv),
               "shared_prefix_pages", self.shared_prefix_pages,
               f"shared pages need page_size set and shared_prefix_pages * page_size <= skv={self.skv}")
        _check(self.page_size is None or not self.grads, "grads", self.grads,
               "a paged KV cache is forward-only (serving); use grads=false or page_size=None")
        _check(isinstance(self.storage, tuple) and len(self.storage) == 3 and all(s in STORAGES for s in self.storage),
               "storage", self.storage, f"three of {STORAGES}, for q, k and v")
        _check(self.storage == PLAIN_STORAGE or (self.layout == "bshd" and self.page_size is None), "storage",
               self.storage, "storage other than plain is for bshd cases without a paged cache; use layout=bshd, "
               "page_size=None or storage=plain")
        _check(isinstance(self.seed, int) and not isinstance(self.seed, bool) and 0 <= self.seed < 2**63, "seed",
               self.seed, "an int in [0, 2**63)")
        fp8.check_fields(self, _check)
        fp8_backward.check_fields(self, _check)

    # -- derived views -------------------------------------------------------------------------------------------
    @property
    def lens_q(self) -> tuple[int, ...]:
        """Valid query count per sequence."""
        return self.seqlens_q if self.seqlens_q is not None else (self.sq,) * self.b

    @property
    def lens_kv(self) -> tuple[int, ...]:
        """Valid key count per sequence."""
        return self.seqlens_kv if self.seqlens_kv is not None else (self.skv,) * self.b

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.d_qk)

    @property
    def right(self) -> int | None:
        """The effective right bound: causal folds into right = 0."""
        return 0 if self.causal else self.window[1]

    @property
    def left(self) -> int | None:
        return self.window[0]

    @property
    def paged(self) -> bool:
        return self.page_size is not None

    @property
    def padded(self) -> bool:
        return self.seqlens_q is not None or self.seqlens_kv is not None

    @property
    def size(self) -> tuple[int, int, int]:
        """How large the case is, for choosing the smallest of several that show one bug: the score elements, then
        the head dims, then the page size."""
        return self.b * self.h * self.sq * self.skv, self.d_qk + self.d_v, self.page_size or 0

    @property
    def mask_kind(self) -> str:
        """none / causal / padding / padding_causal / arbitrary / window: a coverage label, not a field."""
        if self.mask_density is not None:
            return "arbitrary"
        band = "causal" if self.right == 0 and self.left is None else ("window" if self.window != (None, None) or
                                                                       self.causal else "none")
        if self.padded:
            return "padding" if band == "none" else f"padding_{band}"
        return band

    def replace(self, **changes) -> Case:
        if changes.keys() == {"spelling"} and isinstance(changes["spelling"], str):
            # a new spelling is all a drawn case gets before it runs, and nothing else checks a spelling: the fields
            # this case's validation passed are the copy's (a full replace validates all of them again, each case)
            copy = object.__new__(type(self))
            copy.__dict__.update(self.__dict__, spelling=changes["spelling"])
            return copy
        return dataclasses.replace(self, **changes)

    # -- JSON ----------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in OMITTED_AT_DEFAULT and value == f.default:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict, where: str = "case") -> Case:
        """Rebuild a Case; unknown or malformed fields raise ValueError naming `where` and the field."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object of Case fields, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}; known fields are {sorted(known)}")
        kwargs = {}
        for name, value in data.items():
            kwargs[name] = _tupled(value)
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Case:
        return cls.from_dict(json.loads(text))

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                parts.append(f"{f.name}={value!r}")
        return f"Case({', '.join(parts)})"


def _tupled(value):
    if isinstance(value, list):
        return tuple(_tupled(v) for v in value)
    return value


def top_left_shifts(case: Case) -> tuple[int, ...]:
    """The distinct skv_n - sq_n of the sequences with queries and keys: how far a top-left band, or an ALiBi distance,
    moves to be measured from the bottom-right diagonal instead."""
    return tuple(sorted({kv - q for q, kv in zip(case.lens_q, case.lens_kv) if q > 0 and kv > 0}))


def shifted_band(case: Case, d: int) -> tuple[int | None, int | None]:
    """The case's (left, right) moved by `d` (top_left_shifts) to the bottom-right diagonal; a bound may go negative."""
    left, right = case.left, case.right
    return (None if left is None else left + d, None if right is None else right - d)
