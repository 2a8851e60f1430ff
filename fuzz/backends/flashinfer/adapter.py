"""FlashInfer 0.7.2 adapters, one backend per entry point (unverified on hardware: no GPU run has graded them yet):

    flashinfer-single-prefill   flashinfer.single_prefill_with_kv_cache           one request, contiguous k / v
    flashinfer-single-decode    flashinfer.single_decode_with_kv_cache            one request, one query
    flashinfer-ragged           BatchPrefillWithRaggedKVCacheWrapper              packed q / k / v (qo / kv indptr)
    flashinfer-paged-prefill    BatchPrefillWithPagedKVCacheWrapper               paged KV cache (paged cases only)
    flashinfer-paged-decode     BatchDecodeWithPagedKVCacheWrapper                paged KV cache, one query each

Spellings: "" = kv_layout "NHD", "hnd" = "HND" (the pool's pages head-major; single entry points take k / v head-major).
Conventions and refusals are in flashinfer/common.py. Each backend draws its own cases: the general strategy's,
narrowed, moved to the head dims FlashInfer takes, and for decode one query per sequence at the end of its cache.
"""

from __future__ import annotations

import importlib

import torch

from attnfuzz.backends.base import Backend, Unsupported, first_reason
from attnfuzz.backends.flash.common import cuda_arch
from attnfuzz.backends.flashinfer import common as fic
from attnfuzz.backends.layout import cu_seqlens, pack, unpack
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.materialize import Tensors
from attnfuzz.strategies.paged import paged_kv
from attnfuzz.strategies.space import Space, narrow_to

MIN_ARCH = 80


def as_decode(case: Case) -> Case:
    """The case with one query per sequence, bottom-right aligned: the last position of its cache."""
    lens_q = None if case.seqlens_q is None else tuple(min(n, 1) for n in case.seqlens_q)
    return case.replace(sq=1, seqlens_q=lens_q, alignment="bottom_right")


def with_head_dim(case: Case) -> Case:
    """The case with the smallest head dim FlashInfer takes at or above its d_qk, for q, k and v alike."""
    d = next((d for d in fic.HEAD_DIMS if d >= case.d_qk), fic.HEAD_DIMS[-1])
    return case.replace(d_qk=d, d_v=d)


class FlashInferBackend(Backend):
    """One FlashInfer entry point. A subclass sets `name`, `entry` (for messages and `ran`), `paged` (None: takes
    both, True: paged cases only, False: unpaged only), `single` (one request), `decode` (one query per sequence)
    and implements `call(case, tensors) -> (out [total_q, h, d], lse [total_q, h] base 2 or None)`."""

    family = "flashinfer"
    library_module = fic.MODULE
    entry = ""
    paged: bool | None = False
    single = False
    decode = False

    def __init__(self, device: str = "cuda", kernel_backend: str = fic.KERNEL_BACKEND) -> None:
        self.device = device
        self.kernel_backend = kernel_backend
        self.serves_paged = self.paged is not False

    def _module(self):
        return importlib.import_module(fic.MODULE)

    def available(self) -> str | None:
        refused = fic.cubin_refusal(self.kernel_backend)
        if refused:
            return refused
        missing = self.load()
        if missing is not None:
            return missing
        arch = cuda_arch(self.device)
        if arch is None:
            return f"FlashInfer needs a CUDA device (device={self.device!r})"
        if arch < MIN_ARCH:
            return f"FlashInfer's fa2 kernels need sm{MIN_ARCH}+ here, this GPU is sm{arch}"
        return None

    def load(self) -> str | None:
        try:
            self._module()
        except ImportError as e:
            return f"FlashInfer is not installed or does not load ({e}); pip install flashinfer-python=={fic.VERSION}"
        return None

    def version(self) -> str:
        try:
            return str(getattr(self._module(), "__version__", "unknown"))
        except ImportError:
            return ""

    def refusals(self, case: Case) -> list[tuple[bool, str]]:
        return [
            (self.paged is True and not case.paged, f"{self.entry} reads a paged KV cache: the case needs page_size"),
            (self.paged is False and case.paged, f"{self.entry} takes contiguous k / v, not a paged cache"),
            (self.single and case.b != 1, f"{self.entry} computes one request: b={case.b} (the batch wrappers take "
                                          f"several)"),
            (self.decode and case.sq != 1, f"{self.entry} decodes one query per sequence: sq={case.sq}"),
            (self.paged is not False and case.paged and 0 in case.lens_kv,
             "an empty KV cache (cache length 0): kv_last_page_len must be in 1..page_size"),
            (case.layout == "thd" and self.single, f"{self.entry}: one request has no packed layout"),
            (self.paged is False and case.spelling == "hnd" and not self.single,
             f"{self.entry} takes ragged k / v as NHD only"),
        ]

    def unsupported(self, case: Case) -> str | None:
        return first_reason(*fic.capability_refusals(case), *self.refusals(case))

    def spellings(self, case: Case) -> tuple[str, ...]:
        return ("", "hnd") if (self.single or case.paged) else ("",)

    def fitted(self, case: Case) -> Case:
        """A drawn case moved to what this entry point takes by construction: its head dims, one query (decode)."""
        case = with_head_dim(case)
        return as_decode(case) if self.decode else case

    def cases(self, space: Space | None = None):
        """`space` (the harness's, else the default) narrowed to this entry point, each case fitted (head dims 64 /
        128 / 256, decode shapes): drawing head dims or query counts it refuses outright would leave most draws
        UNSUPPORTED."""
        space = (space or Space()).replace(max_head_dim=fic.HEAD_DIMS[-1], paged=self.serves_paged)
        space = narrow_to(space, lambda c: self.unsupported(self.fitted(c)))
        return attention_cases(space).map(self.fitted)

    def compile_key(self, case: Case) -> tuple | None:
        """The JIT module FlashInfer builds (its URI: entry point, q / kv / out dtypes, head dims, position encoding,
        sliding window on, soft cap on, kernel backend). Causal or not, GQA group size, page size, kv_layout, lengths
        and batch are dispatched inside one module."""
        bounds, _ = fic.band(case)
        if bounds is None:
            return None
        _, window_left = bounds
        return (self.entry, case.dtype, case.d_qk, case.d_v, window_left >= 0, case.softcap is not None,
                self.kernel_backend)

    def repro_source(self, case: Case) -> str | None:
        from attnfuzz.backends.flashinfer.repro import flashinfer_source
        return flashinfer_source(self, case)

    def kwargs(self, case: Case) -> dict:
        """The keyword arguments every entry point shares: causal (prefill only), window, scale, soft cap."""
        (causal, window_left), _ = fic.band(case)
        out = {"sm_scale": case.softmax_scale, "window_left": window_left, "logits_soft_cap": case.softcap}
        return out if self.decode else {"causal": causal, **out}

    def call(self, case: Case, t: Tensors) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError

    def run(self, case: Case, tensors: Tensors) -> Output:
        reason = self.unsupported(case)
        if reason:
            raise Unsupported(reason)
        try:
            out, lse = self.call(case, tensors)
        except Exception as e:
            refused = fic.refusal(e)
            if refused is None:
                raise
            raise refused from e
        layout = fic.KV_LAYOUTS[case.spelling]
        return Output(out=unpack(out.detach(), case.lens_q, case.sq), lse=fic.natural_lse(lse, case),
                      ran=f"{self.entry}(kv_layout={layout}, backend={self.kernel_backend})")


def _single_kv(case: Case, x: torch.Tensor) -> torch.Tensor:
    kv = x[0, :case.lens_kv[0]]
    return kv.transpose(0, 1).contiguous() if case.spelling == "hnd" else kv


class SinglePrefill(FlashInferBackend):
    name, entry, single = "flashinfer-single-prefill", "single_prefill_with_kv_cache", True

    def call(self, case, t):
        fi = self._module()
        return fi.single_prefill_with_kv_cache(
            t.q[0, :case.lens_q[0]], _single_kv(case, t.k), _single_kv(case, t.v),
            kv_layout=fic.KV_LAYOUTS[case.spelling], backend=self.kernel_backend, return_lse=True, **self.kwargs(case))


class SingleDecode(FlashInferBackend):
    name, entry, single, decode = "flashinfer-single-decode", "single_decode_with_kv_cache", True, True

    def call(self, case, t):
        fi = self._module()
        if case.lens_q[0] == 0:
            return t.q.new_zeros(0, case.h, case.d_v), None
        out = fi.single_decode_with_kv_cache(t.q[0, 0], _single_kv(case, t.k), _single_kv(case, t.v),
                                             kv_layout=fic.KV_LAYOUTS[case.spelling], **self.kwargs(case))
        return out[None], None


class _Wrapped(FlashInferBackend):
    """A batch wrapper: built on a workspace, planned with the index tensors, run on the data."""

    def workspace(self, device) -> torch.Tensor:
        return torch.zeros(fic.WORKSPACE_BYTES, dtype=torch.uint8, device=device)


class Ragged(_Wrapped):
    name, entry = "flashinfer-ragged", "BatchPrefillWithRaggedKVCacheWrapper"

    def call(self, case, t):
        fi = self._module()
        device = t.q.device
        wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace(device), "NHD", backend=self.kernel_backend)
        wrapper.plan(fic.qo_indptr(case, device), cu_seqlens(case.lens_kv, device), case.h, case.hk, case.d_qk,
                     q_data_type=t.q.dtype, kv_data_type=t.k.dtype, **self.kwargs(case))
        return wrapper.run(pack(t.q, case.lens_q), pack(t.k, case.lens_kv), pack(t.v, case.lens_kv),
                           return_lse=True)


class PagedPrefill(_Wrapped):
    name, entry, paged = "flashinfer-paged-prefill", "BatchPrefillWithPagedKVCacheWrapper", True

    def call(self, case, t):
        fi = self._module()
        device, layout = t.q.device, fic.KV_LAYOUTS[case.spelling]
        cache = paged_kv(case, t.k, t.v)
        indptr, indices, last = fic.paged_metadata(cache)
        wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace(device), layout, backend=self.kernel_backend)
        wrapper.plan(fic.qo_indptr(case, device), indptr, indices, last, case.h, case.hk, case.d_qk,
                     case.page_size, q_data_type=t.q.dtype, kv_data_type=t.k.dtype, **self.kwargs(case))
        return wrapper.run(pack(t.q, case.lens_q), fic.kv_pages(cache, layout), return_lse=True)


class PagedDecode(_Wrapped):
    name, entry, paged, decode = "flashinfer-paged-decode", "BatchDecodeWithPagedKVCacheWrapper", True, True

    def call(self, case, t):
        fi = self._module()
        device, layout = t.q.device, fic.KV_LAYOUTS[case.spelling]
        cache = paged_kv(case, t.k, t.v)
        indptr, indices, last = fic.paged_metadata(cache)
        wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(self.workspace(device), layout, backend=self.kernel_backend)
        wrapper.plan(indptr, indices, last, case.h, case.hk, case.d_qk, case.page_size, q_data_type=t.q.dtype,
                     kv_data_type=t.k.dtype, **self.kwargs(case))
        out, lse = wrapper.run(t.q[:, 0], fic.kv_pages(cache, layout), return_lse=True)
        keep = [n for n, count in enumerate(case.lens_q) if count]   # one row per sequence; drop those with none
        return out[keep], lse[keep]


BACKENDS = {cls.name: cls for cls in (SinglePrefill, SingleDecode, Ragged, PagedPrefill, PagedDecode)}
