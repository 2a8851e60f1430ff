"""Bring your own kernel: `--backend package.module:function` grades any attention function against the oracle.

    # mykernels/attn.py -- one function, the contract below
    import torch

    def attention(q, k, v, *, causal, window, bottom_right, scale, softcap=None):
        ...                       # q [b, sq, h, d_qk], k [b, skv, hk, d_qk], v [b, skv, hk, d_v]
        return out                # [b, sq, h, d_v], or (out, lse) with lse [b, h, sq] in natural log

    attention.supports = lambda case: case.dtype != "float64" or "no float64 path"   # optional

    $ python3 -m attnfuzz run --backend mykernels.attn:attention --device cuda

Contract. The function is called as fn(q, k, v, causal=..., window=..., bottom_right=..., scale=..., **fields):
- q, k, v: torch tensors in the case's dtype on the run's device, [b, s, heads, d] (maybe non-contiguous: the case's
  memory format); query head i reads KV head i // (h // hk).
- causal: bool (the right bound is 0); window: (left, right), None = unbounded; bottom_right: bool, where the
  diagonal sits (query i's diagonal is key i + skv_n - sq_n instead of key i); scale: float, already resolved
  (1/sqrt(d_qk) unless the case sets one). Query i sees key j iff i+off-left <= j <= i+off+right (off from the
  alignment), j < skv_n, and the explicit mask allows it.
- Further fields, passed only when the signature names them (or takes **kwargs), None when the case does not use them:
    softcap       float                   scores -> softcap * tanh(scores / softcap), before ALiBi and the mask
    alibi_slopes  float32 [h]             scores -= alibi_slopes[head] * |i + off - j|
    sink_logits   float32 [h]             the softmax denominator gains exp(sink_logits[head]) (zeros: off-by-one)
    mask          bool [b, 1, sq, skv]    True = query i may see key j; ANDed with the band
    seqlens_q     int32 [b]               valid query rows per sequence (rows past it are not graded)
    seqlens_kv    int32 [b]               valid keys per sequence
  A case needing a field the signature lacks is unsupported (not drawn). seqlens_q is needed only where it changes a
  graded row: bottom-right alignment with a band or ALiBi.
- A paged KV cache (cases with page_size set; strategies/paged.py) reaches a function whose signature names all of
  block_table, k_cache, v_cache and cache_seqlens (by name: **kwargs alone does not opt in); the positional k and v
  are then None, and only the paged form holds the keys:
    k_cache       [num_pages, page_size, hk, d_qk]   pool pages in a shuffled order; slots no sequence owns hold
    v_cache       [num_pages, page_size, hk, d_v]    garbage (K = 0, V = 1e4)
    block_table   int32 [b, max_pages]    sequence n's key j is in pool page block_table[n, j // page_size], slot
                                          j % page_size; entries past a sequence's last page name a garbage page
    cache_seqlens int32 [b]               keys per sequence (the same as seqlens_kv)
  Leading pages may be shared by several sequences (a common prefix). Decode cases have a few queries, bottom-right
  aligned to the cache. Paged cases never check gradients. For an unpaged case the four are None.
- FP8 kernels name q_descale, k_descale and v_descale and are handed FP8 encodings and descales
  (fuzz/backends/fp8_contract.py); they are drawn FP8 cases only, and others none. Those that also name dout and
  dout_descale run an FP8 backward and return (out, lse, dq, dk, dv) for FP8 cases with gradients.
- A row with no visible key must give output 0 (and LSE -inf, or the sink logit).
- Returns out [b, sq, h, d_v], or a tuple whose first element is out and whose second, when not None, is the LSE
  [b, h, sq] (natural log, float32); a tensor in another shape (its axes in another order) is a FAIL:SHAPE. Cases
  with gradients check dq, dk, dv when out is differentiable by autograd.
- Optional `fn.supports(case) -> bool | str` narrows what is drawn: False refuses, a string refuses with that reason.
- Optional `fn.deterministic = True` claims bitwise-reproducible results: each case then runs twice, and any bit that
  differs is a FAIL:NONDETERMINISTIC.
- Optional `fn.batch_invariant = True` claims a sequence's bits do not depend on its batch: on a share of the cases
  with b > 1 one sequence also runs alone (and the batch reversed), and any bit that differs is a
  FAIL:BATCH_VARIANT. Without the claim the same check is reported as an observed property, never a failure.
- Optional `fn.family = "fused"` declares a backward pass at least as precise as FlashAttention's (fp32 accumulators,
  only P and dS rounded to fp16 / bf16): its gradients are then graded against a baseline computed so, not against
  the textbook backward in the dtype (oracles/tolerance.py, FUSED_BACKWARD); about 4x tighter in bf16.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys

import torch

from attnfuzz.backends import fp8_contract, layout
from attnfuzz.backends.base import Backend, Unsupported, first_reason
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

from attnfuzz.strategies.paged import paged_kv

CORE = ("causal", "window", "bottom_right", "scale")
FIELDS = ("softcap", "alibi_slopes", "sink_logits", "mask", "seqlens_q", "seqlens_kv")
PAGED_FIELDS = ("block_table", "k_cache", "v_cache", "cache_seqlens")


def needed_fields(case: Case) -> tuple[str, ...]:
    """The optional fields a function must accept to compute this case."""
    banded = case.left is not None or case.right is not None or case.alibi_slopes is not None
    needs = {"softcap": case.softcap is not None, "alibi_slopes": case.alibi_slopes is not None,
             "sink_logits": case.softmax != "vanilla", "mask": case.mask_density is not None,
             "seqlens_q": case.seqlens_q is not None and case.alignment == "bottom_right" and banded,
             "seqlens_kv": case.seqlens_kv is not None}
    return tuple(name for name in FIELDS if needs[name])


FAMILIES = ("custom", "fused")  # what fn.family may name: the textbook gradient baseline, or the fused one


class CustomBackend(Backend):
    family = "custom"

    def __init__(self, spec: str, fn, device: str, import_path: str | None = None):
        self.name, self.fn, self.device = spec, fn, str(device)
        self.family = getattr(fn, "family", "custom")
        self.import_path = import_path  # the sys.path folder its module came from
        self.deterministic = bool(getattr(fn, "deterministic", False))
        self.batch_invariant = bool(getattr(fn, "batch_invariant", False))
        params = inspect.signature(fn).parameters.values()
        self.takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self.accepts = {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}
        self.serves_paged = all(name in self.accepts for name in PAGED_FIELDS)
        self.serves_fp8 = all(name in self.accepts for name in fp8_contract.FP8_FIELDS)
        self.fp8_takes = fp8_contract.declared(fn) if self.serves_fp8 else None
        self.fp8_backward = self.serves_fp8 and all(name in self.accepts for name in fp8_contract.BACKWARD_FIELDS)

    def version(self) -> str:
        module = inspect.getmodule(self.fn)
        return str(getattr(module, "__version__", ""))

    def available(self) -> str | None:
        if torch.device(self.device).type == "cuda" and not torch.cuda.is_available():
            return f"{self.name}: device {self.device!r} is not usable here (torch.cuda.is_available() is False)"
        return None

    def _fields(self) -> tuple[str, ...]:
        return FIELDS if self.takes_all else tuple(f for f in FIELDS if f in self.accepts)

    def unsupported(self, case: Case) -> str | None:
        missing = [f for f in needed_fields(case) if f not in self._fields()
                   and not (f == "seqlens_kv" and case.paged and self.serves_paged)]  # cache_seqlens holds them
        reason = first_reason(
            (self.available() is not None, self.available() or ""),
            (bool(missing), f"{self.name} does not accept {', '.join(missing)} (add the keyword argument(s) to its "
                            f"signature to be given such cases)"),
            (case.paged and not self.serves_paged,
             f"{self.name} does not accept block_table, k_cache, v_cache, cache_seqlens (name all four in its "
             f"signature to be given paged KV caches)"),
            (case.layout == "thd", "the custom contract passes [b, s, h, d] tensors; packed thd is not expressible "
                                   "(padding comes as seqlens_q / seqlens_kv)"),
            (case.spelling != "", f"spelling={case.spelling!r}: a custom function has only the default spelling ''"),
            (case.fp8 is not None and not self.serves_fp8,
             f"{self.name} does not accept {', '.join(fp8_contract.FP8_FIELDS)} (name them in its signature to be "
             f"given FP8 inputs)"),
        ) or (fp8_contract.refusal(self.name, self.fp8_takes, case, self.fp8_backward) if self.serves_fp8 else None)
        if reason is not None:
            return reason
        supports = getattr(self.fn, "supports", None)
        if supports is None:
            return None
        verdict = supports(case)
        if isinstance(verdict, str):
            return verdict or f"{self.name}.supports(case) refused it"
        return None if verdict else f"{self.name}.supports(case) returned {verdict!r}"

    def run(self, case: Case, tensors: Tensors) -> Output:
        if case.fp8 is not None:
            return self._run_fp8(case, tensors)
        leaves, views = [], []
        for x, lens in ((tensors.q, case.lens_q), (tensors.k, case.lens_kv), (tensors.v, case.lens_kv)):
            leaf = layout.to_layout(case, x, lens).detach().requires_grad_(case.grads)
            leaves.append(leaf)
            views.append(leaf.transpose(0, 1) if case.layout == "sbhd" else leaf)
        kwargs = {"causal": case.causal, "window": case.window, "bottom_right": case.alignment == "bottom_right",
                  "scale": case.softmax_scale}
        kwargs.update({name: value for name, value in _field_values(case, tensors).items() if name in self._fields()})
        if self.serves_paged:
            kwargs.update(_paged_values(case, tensors))
            if case.paged:
                views[1] = views[2] = None
        with torch.set_grad_enabled(case.grads):
            result = self.fn(*views, **kwargs)
        out, lse = (result[0], result[1] if len(result) > 1 else None) if isinstance(result, tuple) else (result, None)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{self.name} returned {type(out).__name__}; the contract is out [b, sq, h, d_v] or a "
                            f"tuple (out, lse, ...)")
        output = Output(out=out.detach(), lse=lse.detach() if isinstance(lse, torch.Tensor) else None,
                        ran=self.name)
        if case.grads and tuple(out.shape) == (case.b, case.sq, case.h, case.d_v):  # else the grader says SHAPE
            if not out.requires_grad:
                raise Unsupported(f"{self.name}: the case checks gradients but the output is not differentiable by "
                                  f"autograd (no grad_fn); refuse grads=True cases in supports() or make it so")
            grads = torch.autograd.grad(out, leaves, tensors.dout, allow_unused=True)
            output.dq, output.dk, output.dv = (
                layout.from_layout(case, g if g is not None else torch.zeros_like(leaf), (), s)
                for g, leaf, s in zip(grads, leaves, (case.sq, case.skv, case.skv)))
        return output

    def _run_fp8(self, case: Case, tensors: Tensors) -> Output:
        """An FP8 case (fuzz/backends/fp8_contract.py): encodings and descales in, the output dequantised."""
        views, kwargs = fp8_contract.kernel_inputs(case, tensors)
        kwargs.update(causal=case.causal, window=case.window, bottom_right=case.alignment == "bottom_right",
                      scale=case.softmax_scale)
        kwargs.update({name: value for name, value in _field_values(case, tensors).items() if name in self._fields()})
        kwargs = {name: value for name, value in kwargs.items() if name in self.accepts or self.takes_all}
        result = self.fn(*views, **kwargs)
        out, lse = (result[0], result[1] if len(result) > 1 else None) if isinstance(result, tuple) else (result, None)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{self.name} returned {type(out).__name__}; the contract is out [b, sq, h, d_v] or a "
                            f"tuple (out, lse, ...)")
        output = Output(out=fp8_contract.dequantised(case, tensors, out.detach()),
                        lse=lse.detach() if isinstance(lse, torch.Tensor) else None, ran=self.name)
        if case.grads:   # an FP8 backward returns (out, lse, dq, dk, dv) (fp8_contract.py)
            grads = result[2:5] if isinstance(result, tuple) and len(result) >= 5 else (None, None, None)
            output.dq, output.dk, output.dv = fp8_contract.dequantised_grads(case, tensors, grads)
        return output


def _field_values(case: Case, tensors: Tensors) -> dict:
    device = tensors.q.device

    def lens(values):
        return torch.tensor(values, dtype=torch.int32, device=device) if values is not None else None

    return {"softcap": case.softcap, "alibi_slopes": tensors.alibi, "sink_logits": tensors.sink,
            "mask": tensors.mask, "seqlens_q": lens(case.seqlens_q), "seqlens_kv": lens(case.seqlens_kv)}


def _paged_values(case: Case, tensors: Tensors) -> dict:
    if not case.paged:
        return dict.fromkeys(PAGED_FIELDS)
    paged = paged_kv(case, tensors.k, tensors.v)
    return {"block_table": paged.block_table, "k_cache": paged.k_cache, "v_cache": paged.v_cache,
            "cache_seqlens": paged.cache_seqlens}


def load_custom(spec: str, device: str = "cpu") -> CustomBackend:
    """The backend for 'package.module:function'; a bad spec raises ValueError naming the spec and the fix."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"--backend={spec!r}: a custom kernel is given as 'package.module:function' (one colon "
                         f"between an importable module and the function's name)")
    module_name, attr = spec.split(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # as `python -m` would: the `attnfuzz` script finds modules where it is run
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--backend={spec!r}: module {module_name!r} cannot be imported ({e}); put its folder on "
                         f"PYTHONPATH or install its package") from None
    if not hasattr(module, attr):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(f"--backend={spec!r}: module {module_name!r} has no attribute {attr!r}; its callables are "
                         f"{names}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise ValueError(f"--backend={spec!r}: {attr!r} is a {type(fn).__name__}, not callable; name the attention "
                         f"function itself")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as e:
        raise ValueError(f"--backend={spec!r}: cannot read the signature of {attr!r} ({e}); wrap it in a Python "
                         f"function with the contract's signature") from None
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    names = {p.name for p in params}
    missing = [] if takes_all else [name for name in CORE if name not in names]
    known = {*CORE, *FIELDS, *PAGED_FIELDS, *fp8_contract.FP8_FIELDS, *fp8_contract.OPTIONAL,
             *fp8_contract.BACKWARD_FIELDS, *fp8_contract.BACKWARD_OPTIONAL}
    stray = [p.name for p in params[3:] if p.default is inspect.Parameter.empty and p.name not in known
             and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if (len(positional) < 3 and not varargs) or missing or stray:
        raise ValueError(f"--backend={spec!r}: {attr}{inspect.signature(fn)} does not fit the contract "
                         f"fn(q, k, v, *, causal, window, bottom_right, scale, [optional fields]); "
                         + "; ".join(filter(None, [
                             "it needs three positional parameters q, k, v" if len(positional) < 3 and not varargs
                             else "", f"missing keyword(s) {missing}" if missing else "",
                             f"parameter(s) {stray} have no default and are not contract fields {sorted(known)}"
                             if stray else ""])))
    family = getattr(fn, "family", "custom")
    if family not in FAMILIES:
        raise ValueError(f"--backend={spec!r}: {attr}.family={family!r} is not one of {list(FAMILIES)}; set "
                         f"'fused' only for a backward pass with fp32 accumulators that rounds only P and dS")
    return CustomBackend(spec, fn, device, import_path=_import_path(module, module_name))


def _import_path(module, module_name: str) -> str | None:
    """The folder that had to be on sys.path for `import module_name` to find `module`: its file's folder, one level
    up per dotted part (mykernels.attn in /p/mykernels/attn.py -> /p); None for a module without a file."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = os.path.abspath(file)
    if os.path.basename(path).startswith("__init__."):
        path = os.path.dirname(path)
    for _ in module_name.split("."):
        path = os.path.dirname(path)
    return path

