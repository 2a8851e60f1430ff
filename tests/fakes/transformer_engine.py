"""A fake TransformerEngine DotProductAttention: TE 2.20.2's documented mask semantics in plain torch, its
NVTE_* backend selection with the cached-selection record (`_attention_backends`), and knobs that make it lie.

Semantics (the DotProductAttention docstring): attn_mask_type in no_mask / padding / causal / padding_causal /
causal_bottom_right / padding_causal_bottom_right / arbitrary; window_size (-1 = unbounded) is aligned by
bottom_right_diagonal, forced False for causal / padding_causal and True for the *_bottom_right types (default True
otherwise); padding comes from cu_seqlens or from attention_mask (True = padding token); "arbitrary" masks are True
where masked out; ALiBi adds -slope * |i + off - j|; off-by-one / learnable softmax put exp(softmax_offset) in the
denominator; output is [b, s, h*d_v] / [s, b, h*d_v] / [t, h*d_v].

Knobs on FakeTE: `misroute` (run another backend's submodule than the one selected), `misrecord` (record another
selection than the one run), `cache_selection` (reuse the last selection when the params match, as TE does, unless
the record is marked stale), `flash_impl` (run FlashAttention through a flash-attn module the way TE 2.20.2 calls FA4:
causal = "causal" in the mask type and window_size as check_set_window_size left it, e.g. (-1, 0)), and three that
each mishandle one argument form: `mask_type_exact` (no normalisation of 'padding,causal' and the like: a string
outside the canonical types is read as no_mask), `causal_unbounded_window` (a causal type given window (-1, -1)
reads the right -1 as unbounded and drops the causal bound), `inferred_max_seqlen` (thd without max_seqlen: bands
aligned by the rounded-up longest lengths instead of each sequence's). FP8 attention (te.autocast, Float8Tensor
inputs, `fp8_bug` for its planted bugs) is tests/fakes/te_fp8.py.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import types
import warnings

import torch

from tests.fakes import te_fp8
from tests.fakes.attention import alibi_bias, attend, band_keep

FLASH, FUSED, UNFUSED = "FlashAttention", "FusedAttention", "UnfusedDotProductAttention"
FLAG = {FLASH: "use_flash_attention", FUSED: "use_fused_attention", UNFUSED: "use_unfused_attention"}
SUBMODULE = {FLASH: "flash_attention", FUSED: "fused_attention", UNFUSED: "unfused_attention"}
ENV = {FLASH: "NVTE_FLASH_ATTN", FUSED: "NVTE_FUSED_ATTN", UNFUSED: "NVTE_UNFUSED_ATTN"}


def check_set_window_size(mask_type, window):
    """TE's normalisation table: causal types take (-1, 0) or (>=0, 0); the others (-1, -1) or (>=0, >=0), and a
    (-1, 0) given with them becomes (-1, -1) with a warning."""
    if "causal" in mask_type:
        if window is None:
            return (-1, 0)
        if window == (-1, -1) or (window[0] >= 0 and window[1] != 0):
            warnings.warn(f"window_size should be (-1, 0) or (>=0, 0) for attn_mask_type={mask_type}")
            return (window[0], 0)
        assert window == (-1, 0) or (window[0] >= 0 and window[1] == 0), f"bad window {window} for {mask_type}"
        return window
    if window is None:
        return (-1, -1)
    if window == (-1, 0):
        warnings.warn(f"window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type={mask_type}")
        return (-1, -1)
    assert window == (-1, -1) or min(window) >= 0, f"bad window {window} for {mask_type}"
    return window


class FakeTE:
    """One fake TE install: records constructor and forward calls; knobs as in the module docstring."""

    def __init__(self, misroute=None, misrecord=None, cache_selection=True, flash_impl=None, mask_type_exact=False,
                 causal_unbounded_window=False, inferred_max_seqlen=False, fp8_bug=None):
        self.misroute, self.misrecord, self.cache_selection = misroute, misrecord, cache_selection
        self.flash_impl = flash_impl
        self.mask_type_exact, self.causal_unbounded_window = mask_type_exact, causal_unbounded_window
        self.inferred_max_seqlen = inferred_max_seqlen
        self.fp8_bug = fp8_bug
        self.inits, self.forwards = [], []
        self.record = {"attention_params": None, "use_flash_attention": None, "flash_attention_backend": None,
                       "use_fused_attention": None, "fused_attention_backend": None, "use_unfused_attention": None,
                       "backend_selection_requires_update": False}
        self.modules = self._build()

    def _build(self) -> dict:
        def package(name):
            m = types.ModuleType(name)
            m.__path__ = []
            return m

        te, pt = package("transformer_engine"), package("transformer_engine.pytorch")
        te.__version__ = "2.20.2+fake"
        attn = package("transformer_engine.pytorch.attention")
        dpa_pkg = package("transformer_engine.pytorch.attention.dot_product_attention")
        dpa_mod = types.ModuleType("transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention")
        dpa_mod._attention_backends = self.record
        utils = types.ModuleType("transformer_engine.pytorch.attention.dot_product_attention.utils")
        utils.AttentionLogging = type("AttentionLogging", (), {"_log_level": logging.WARNING,
                                                               "_stream_handler": logging.StreamHandler()})
        utils.FlashAttentionUtils = type("FlashAttentionUtils", (), {"is_installed": False, "v3_is_installed": False,
                                                                     "v4_is_installed": True,
                                                                     "fa4_version": "4.0.0b36"})
        fake = self

        class DotProductAttention(_FakeDPA):
            def __init__(self, *args, **kwargs):
                super().__init__(fake, utils, *args, **kwargs)

        pt.DotProductAttention = DotProductAttention
        te.pytorch = pt
        te_fp8.export(pt)
        extra = te_fp8.modules()
        te.common = extra["transformer_engine.common"]
        return {**{m.__name__: m for m in (te, pt, attn, dpa_pkg, dpa_mod, utils)}, **extra}

    def install(self, monkeypatch) -> FakeTE:
        for name, module in self.modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        return self


class _Core(torch.nn.Module):
    """One backend submodule; all three compute the same (correct) attention unless `flash_impl` replaces one."""

    def __init__(self, impl=None):
        super().__init__()
        self.impl = impl

    def forward(self, spec, q, k, v):
        return self.impl(spec, q, k, v) if self.impl is not None else _compute(spec, q, k, v)


def fa4_passthrough(fa4_cute):
    """A flash_impl calling a (fake) flash_attn.cute the way TE 2.20.2 does for bshd / sbhd without padding."""
    def run(spec, q, k, v):
        assert spec["fmt"] in ("bshd", "sbhd") and "padding" not in spec["mask_type"], "passthrough: bshd/sbhd only"
        q, k, v = (_to_bshd(spec["fmt"], x) for x in (q, k, v))
        out, _ = fa4_cute.flash_attn_func(q, k, v, softmax_scale=spec["scale"], causal="causal" in spec["mask_type"],
                                          window_size=spec["window"])
        out = out.reshape(*out.shape[:2], out.shape[2] * out.shape[3])
        return out.transpose(0, 1) if spec["fmt"] == "sbhd" else out
    return run


MASK_TYPES = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right",
              "arbitrary")


def normalised(fake, mask_type):
    """TE's reading of an attn_mask_type string: commas as underscores, 'causal_padding' as 'padding_causal'."""
    if fake.mask_type_exact:
        return mask_type if mask_type in MASK_TYPES else "no_mask"
    mask_type = mask_type.replace(",", "_")
    return "padding_causal" if mask_type == "causal_padding" else mask_type


class _FakeDPA(torch.nn.Module):
    def __init__(self, fake, utils, num_attention_heads, kv_channels, num_gqa_groups=None, attention_dropout=0.0,
                 qkv_format="sbhd", attn_mask_type="causal", window_size=None, bottom_right_diagonal=None,
                 softcap=0.0, attention_type="self", softmax_scale=None, softmax_type="vanilla", **rest):
        super().__init__()
        fake.inits.append(dict(num_attention_heads=num_attention_heads, kv_channels=kv_channels,
                               num_gqa_groups=num_gqa_groups, qkv_format=qkv_format, attn_mask_type=attn_mask_type,
                               window_size=window_size, bottom_right_diagonal=bottom_right_diagonal, softcap=softcap,
                               attention_type=attention_type, softmax_scale=softmax_scale,
                               softmax_type=softmax_type, **rest))
        self.fake, self.utils = fake, utils
        self.h, self.attention_type, self.qkv_format = num_attention_heads, attention_type, qkv_format
        self.d_qk = kv_channels if isinstance(kv_channels, int) else kv_channels[0]
        self.mask_type, self.window, self.brd = attn_mask_type, window_size, bottom_right_diagonal
        self.softcap, self.softmax_type = softcap, softmax_type
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.d_qk)
        self.softmax_offset = None
        if softmax_type == "off-by-one":
            self.softmax_offset = torch.zeros(num_attention_heads)
        if softmax_type == "learnable":
            self.softmax_offset = torch.nn.Parameter(torch.zeros(num_attention_heads))
        self.flash_attention, self.fused_attention = _Core(fake.flash_impl), _Core()
        self.unfused_attention = _Core()
        self.fp8, self.fp8_meta = False, {}

    def init_fp8_metadata(self, num_gemms=1):
        te_fp8.init_fp8_metadata(self, num_gemms)

    def _select(self, key, q, mask_type, softcap, fp8=False):
        record, log = self.fake.record, logging.getLogger("DotProductAttention")
        if (self.fake.cache_selection and record["attention_params"] == key
                and not record["backend_selection_requires_update"]):
            return next(b for b, f in FLAG.items() if record[f])
        log.setLevel(self.utils.AttentionLogging._log_level)
        eligible = [b for b in (FUSED, FLASH, UNFUSED) if os.environ.get(ENV[b], "1") == "1"]
        rules = {FLASH: [(fp8, "FP8 attention"), (self.softmax_type != "vanilla", f"softmax_type = {self.softmax_type}"),
                         (mask_type == "arbitrary", "arbitrary mask"), (q.dtype == torch.float32, "qkv_dtype fp32")],
                 FUSED: [(mask_type == "arbitrary", "arbitrary mask"), (softcap != 0.0, "softcap"),
                         (q.dtype == torch.float32, "qkv_dtype fp32")],
                 UNFUSED: [(fp8, "FP8 attention")]}
        for backend in list(eligible):
            for refused, why in rules[backend]:
                if refused:
                    log.debug("Disabling %s for %s", backend, why)
                    eligible.remove(backend)
                    break
        if not eligible:
            raise ValueError("No dot product attention backend is available for the provided inputs.")
        chosen = eligible[0]
        record.update({f: b == chosen for b, f in FLAG.items()}, attention_params=key,
                      backend_selection_requires_update=False,
                      flash_attention_backend="4.0.0b36" if chosen == FLASH else None,
                      fused_attention_backend=1 if chosen == FUSED else None)
        return chosen

    def forward(self, q, k, v, attention_mask=None, qkv_format=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                max_seqlen_q=None, max_seqlen_kv=None, attn_mask_type=None, window_size=None,
                bottom_right_diagonal=None, softcap=None, core_attention_bias_type="no_bias",
                core_attention_bias=None, alibi_slopes=None, **rest):
        self.fake.forwards.append(dict(attention_mask=attention_mask, qkv_format=qkv_format,
                                       cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                                       max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
                                       attn_mask_type=attn_mask_type, window_size=window_size,
                                       bottom_right_diagonal=bottom_right_diagonal,
                                       core_attention_bias_type=core_attention_bias_type,
                                       alibi_slopes=alibi_slopes, **rest))
        self.init_fp8_metadata(num_gemms=3)
        fp8 = te_fp8.attention_on(self)
        mask_type = normalised(self.fake, attn_mask_type if attn_mask_type is not None else self.mask_type)
        given = window_size if window_size is not None else self.window
        window = check_set_window_size(mask_type, given)
        causal = "causal" in mask_type
        if self.fake.causal_unbounded_window and causal and given == (-1, -1):
            causal, window = False, given
        brd = bottom_right_diagonal if bottom_right_diagonal is not None else self.brd
        if mask_type in ("causal", "padding_causal"):
            brd = False
        if brd is None or "bottom_right" in mask_type:
            brd = True
        softcap = self.softcap if softcap is None else softcap
        fmt = qkv_format or self.qkv_format
        assert fmt != "thd" or "padding" in mask_type, "thd needs a padding mask type"
        assert (alibi_slopes is None) == (core_attention_bias_type != "alibi"), "alibi needs its bias type"
        key = (mask_type, window, brd, softcap, core_attention_bias_type, q.dtype, fmt, tuple(q.shape),
               tuple(k.shape), tuple(v.shape), fp8)
        selected = self._select(key, q, mask_type, softcap, fp8)
        if self.fake.misrecord:
            self.fake.record.update({f: b == self.fake.misrecord for b, f in FLAG.items()})
        ran = self.fake.misroute or selected
        inferred = self.fake.inferred_max_seqlen and fmt == "thd" and max_seqlen_q is None
        spec = dict(fmt=fmt, mask_type=mask_type, causal=causal, window=window, brd=brd, softcap=softcap,
                    alibi=alibi_slopes, inferred=inferred,
                    attention_mask=attention_mask, cu_q=cu_seqlens_q, cu_k=cu_seqlens_kv, scale=self.scale,
                    sink=self.softmax_offset if self.softmax_type != "vanilla" else None,
                    cross=self.attention_type == "cross")
        if fp8:
            spec["attend"] = te_fp8.p_quantised_attend(self)
            bshd = [_to_bshd(fmt, x) for x in (q, k)]
            lengths = _lengths(spec, bshd[0].shape[0], bshd[0].shape[1], bshd[1].shape[1])
            return te_fp8.attention(self, getattr(self, SUBMODULE[ran]), spec, lengths, q, k, v,
                                    rest.get("fp8_output", False))
        if isinstance(q, te_fp8.Float8Tensor):   # FP8 inputs without FP8 attention: dequantised, as TE does
            q, k, v = (x.dequantize() for x in (q, k, v))
        return getattr(self, SUBMODULE[ran])(spec, q, k, v)


def _to_bshd(fmt, x):
    return x.transpose(0, 1) if fmt == "sbhd" else x


def _lengths(spec, b, sq, skv):
    if "padding" not in spec["mask_type"]:
        return [sq] * b, [skv] * b
    if spec["cu_q"] is not None:
        return spec["cu_q"].diff().tolist(), spec["cu_k"].diff().tolist()
    masks = spec["attention_mask"]
    mask_q, mask_k = masks if isinstance(masks, tuple) else (masks, masks)
    return (~mask_q).reshape(b, -1).sum(-1).tolist(), (~mask_k).reshape(b, -1).sum(-1).tolist()


def _compute(spec, q, k, v):
    fmt = spec["fmt"]
    if fmt == "thd":
        cu_q, cu_k = spec["cu_q"].tolist(), spec["cu_k"].tolist()
        b = len(cu_q) - 1
        seqs = [(q[cu_q[n]:cu_q[n + 1]], k[cu_k[n]:cu_k[n + 1]], v[cu_k[n]:cu_k[n + 1]]) for n in range(b)]
        lens_q, lens_k = [len(s[0]) for s in seqs], [len(s[1]) for s in seqs]
    else:
        q, k, v = (_to_bshd(fmt, x) for x in (q, k, v))
        b = q.shape[0]
        lens_q, lens_k = _lengths(spec, b, q.shape[1], k.shape[1])
        seqs = [(q[n, :lens_q[n]], k[n, :lens_k[n]], v[n, :lens_k[n]]) for n in range(b)]
    left, right = (None if w < 0 else w for w in spec["window"])
    if spec["causal"]:
        right = 0
    outs = []
    for n, (q_n, k_n, v_n) in enumerate(seqs):
        off = lens_k[n] - lens_q[n] if spec["brd"] else 0
        if spec["inferred"] and spec["brd"]:   # the rounded-up longest lengths, as TE infers max_seqlen for thd
            off = -(-max(lens_k) // 64) * 64 - -(-max(lens_q) // 64) * 64
        keep = band_keep(lens_q[n], lens_k[n], off, left, right, q.device)
        if spec["mask_type"] == "arbitrary":
            keep = keep & ~spec["attention_mask"][n % spec["attention_mask"].shape[0], 0, :lens_q[n], :lens_k[n]]
        bias = alibi_bias(spec["alibi"], lens_q[n], lens_k[n], off, q.device) if spec["alibi"] is not None else None
        o, _ = spec.get("attend", attend)(q_n, k_n, v_n, keep, scale=spec["scale"], softcap=spec["softcap"],
                                          bias=bias, sink=spec["sink"])
        outs.append(o.reshape(o.shape[0], o.shape[1] * o.shape[2]))
    if fmt == "thd":
        return torch.cat(outs)
    width = q.shape[1]
    out = torch.stack([torch.cat([o, o.new_zeros(width - o.shape[0], o.shape[1])]) for o in outs])
    return out.transpose(0, 1) if fmt == "sbhd" else out
