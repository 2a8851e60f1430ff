"""FlashInfer 0.7.2 adapters, one backend per entry point (unverified on hardware: no GPU run has graded them yet):

    flashinfer-single-prefill   flashinfer.single_prefill_with_kv_cache           one request, contiguous k / v
    flashinfer-single-decode    flashinfer.single_decode_with_kv_cache            one request, one query
    flashinfer-ragged           BatchPrefillWithRaggedKVCacheWrapper              packed q / k / v (qo / kv indptr)
    flashinfer-paged-prefill    BatchPrefillWithPagedKVCacheWrapper               paged KV cache (paged cases only)
    flashinfer-paged-decode     BatchDecodeWithPagedKVCacheWrapper                paged KV cache, one query each
    flashinfer-paged-prefill-fp8kv, flashinfer-paged-decode-fp8kv: the two paged wrappers over an FP8 KV cache, FP8
                                cases only (flashinfer/fp8kv.py)

Spellings (kv_layout, the pool as one tensor, the window / custom masks, sm_scale None, logits_soft_cap 0, return_lse,
use_tensor_cores) are in flashinfer/spelling.py; conventions and refusals in flashinfer/common.py. Each backend draws its own cases: the general strategy's,
narrowed, moved to the head dims FlashInfer takes, and for decode one query per sequence at the end of its cache.
"""

from __future__ import annotations

import importlib

import torch

from attnfuzz.backends import fp8_contract
from attnfuzz.backends.base import Backend, Unsupported, first_reason
from attnfuzz.backends.flash.common import cuda_arch
from attnfuzz.backends.flashinfer import common as fic
from attnfuzz.backends.flashinfer import fp8kv
from attnfuzz.backends.flashinfer import spelling as fis
from attnfuzz.backends.layout import cu_seqlens, pack, unpack
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.materialize import TORCH_DTYPES, Tensors
from attnfuzz.strategies.paged import PagedKV, paged_kv
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
            (self.paged is False and case.spelling.split("+")[0] == "hnd" and not self.single,
             f"{self.entry} takes ragged k / v as NHD only"),
            (case.fp8 is not None and not self.serves_fp8,
             f"fp8={case.fp8!r}: {self.name} passes q / k / v in the case's dtype; FP8 KV caches go to "
             f"flashinfer-paged-*-fp8kv (flashinfer/fp8kv.py)"),
        ]

    def unsupported(self, case: Case) -> str | None:
        return first_reason(*fic.capability_refusals(case), *self.refusals(case),
                            (case.spelling not in self.spellings(case),
                             f"spelling={case.spelling!r} is not one of {self.entry}'s spellings for this case "
                             f"(flashinfer/spelling.py)"))

    @property
    def entry_point(self) -> fis.EntryPoint:
        return fis.EntryPoint(self.single, self.decode, self.paged is not False, not isinstance(self, SingleDecode))

    def spellings(self, case: Case) -> tuple[str, ...]:
        return fis.spelling_names(self.entry_point, case)

    def spelled(self, case: Case) -> fis.Spelling:
        spelling = fis.parse(self.entry_point, case)
        if spelling is None:
            raise Unsupported(self.unsupported(case) or f"spelling={case.spelling!r} is unknown")
        return spelling

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
        sliding window on, soft cap on, kernel backend; decode: tensor cores or not). Causal or custom mask, GQA group
        size, page size, kv_layout, lengths and batch are dispatched inside one module."""
        spelling = fis.parse(self.entry_point, case)
        if fic.band(case)[0] is None or spelling is None:
            return None
        kw = self.kwargs(case)
        return (self.entry, case.dtype, case.d_qk, case.d_v, kw["window_left"] >= 0, bool(kw["logits_soft_cap"]),
                self.kernel_backend, bool(spelling.cores))

    def repro_source(self, case: Case) -> str | None:
        from attnfuzz.backends.flashinfer.repro import flashinfer_source
        return flashinfer_source(self, case)

    def kwargs(self, case: Case) -> dict:
        """The keyword arguments every entry point shares, in the case's spelling: causal (prefill only), window,
        scale, soft cap."""
        (causal, window_left), _ = fic.band(case)
        return fis.kwargs(case, self.spelled(case), causal, window_left, self.decode)

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
        spelling = self.spelled(case)
        forms = spelling.name.removeprefix(spelling.layout).lstrip("+")   # the parts beyond kv_layout
        return Output(out=unpack(out.detach(), case.lens_q, case.sq), lse=fic.natural_lse(lse, case),
                      ran=f"{self.entry}(kv_layout={spelling.kv_layout}, backend={self.kernel_backend}"
                          + (f", {forms})" if forms else ")"))


def _single_kv(spelling: fis.Spelling, case: Case, x: torch.Tensor) -> torch.Tensor:
    kv = x[0, :case.lens_kv[0]]
    return kv.transpose(0, 1).contiguous() if spelling.layout else kv


def _returned(result, return_lse: bool):
    """(out, lse or None) from an entry point called with return_lse."""
    return result if return_lse else (result, None)


class SinglePrefill(FlashInferBackend):
    name, entry, single = "flashinfer-single-prefill", "single_prefill_with_kv_cache", True

    def call(self, case, t):
        fi, spelling = self._module(), self.spelled(case)
        lse = not spelling.lse
        result = fi.single_prefill_with_kv_cache(
            t.q[0, :case.lens_q[0]], _single_kv(spelling, case, t.k), _single_kv(spelling, case, t.v),
            **fis.mask_kwargs(case, spelling, t, single=True), kv_layout=spelling.kv_layout,
            backend=self.kernel_backend, return_lse=lse, **self.kwargs(case))
        return _returned(result, lse)


class SingleDecode(FlashInferBackend):
    name, entry, single, decode = "flashinfer-single-decode", "single_decode_with_kv_cache", True, True

    def call(self, case, t):
        fi, spelling = self._module(), self.spelled(case)
        if case.lens_q[0] == 0:
            return t.q.new_zeros(0, case.h, case.d_v), None
        lse = bool(spelling.lse)
        extra = {"use_tensor_cores": True} if spelling.cores else {}
        if lse:
            extra["return_lse"] = True
        out, lse = _returned(fi.single_decode_with_kv_cache(
            t.q[0, 0], _single_kv(spelling, case, t.k), _single_kv(spelling, case, t.v),
            kv_layout=spelling.kv_layout, **extra, **self.kwargs(case)), lse)
        # the contract's LSE is [h]; with use_tensor_cores and one head FlashInfer 0.7.2 squeezes it to a 0-d
        # tensor (decode.py: lse.squeeze(0) on an [h] tensor), which the grader reports as SHAPE
        return out[None], None if lse is None else (lse[None] if lse.dim() == 1 else lse)


class _Wrapped(FlashInferBackend):
    """A batch wrapper: built on a workspace, planned with the index tensors, run on the data."""

    def workspace(self, device) -> torch.Tensor:
        return torch.zeros(fic.WORKSPACE_BYTES, dtype=torch.uint8, device=device)

    def paged_inputs(self, case: Case, t: Tensors) -> tuple[torch.Tensor, PagedKV, dict]:
        """(q [b, sq, h, d], the paged cache, run()'s scale keywords): the case's tensors as they are (an FP8 KV
        cache's adapter hands its encodings and scales, flashinfer/fp8kv.py)."""
        return t.q, paged_kv(case, t.k, t.v), {}


class Ragged(_Wrapped):
    name, entry = "flashinfer-ragged", "BatchPrefillWithRaggedKVCacheWrapper"

    def call(self, case, t):
        fi, spelling = self._module(), self.spelled(case)
        device, lse = t.q.device, not spelling.lse
        wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace(device), "NHD", backend=self.kernel_backend)
        wrapper.plan(fic.qo_indptr(case, device), cu_seqlens(case.lens_kv, device), case.h, case.hk, case.d_qk,
                     **fis.mask_kwargs(case, spelling, t, single=False), q_data_type=t.q.dtype,
                     kv_data_type=t.k.dtype, **self.kwargs(case))
        return _returned(wrapper.run(pack(t.q, case.lens_q), pack(t.k, case.lens_kv), pack(t.v, case.lens_kv),
                                     return_lse=lse), lse)


class PagedPrefill(_Wrapped):
    name, entry, paged = "flashinfer-paged-prefill", "BatchPrefillWithPagedKVCacheWrapper", True

    def call(self, case, t):
        fi, spelling = self._module(), self.spelled(case)
        device, layout, lse = t.q.device, spelling.kv_layout, not spelling.lse
        q, cache, scales = self.paged_inputs(case, t)
        indptr, indices, last = fic.paged_metadata(cache)
        wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace(device), layout, backend=self.kernel_backend)
        wrapper.plan(fic.qo_indptr(case, device), indptr, indices, last, case.h, case.hk, case.d_qk,
                     case.page_size, **fis.mask_kwargs(case, spelling, t, single=False), q_data_type=q.dtype,
                     kv_data_type=cache.k_cache.dtype, **self.kwargs(case))
        pages = fis.paged_cache(*fic.kv_pages(cache, layout), spelling)
        return _returned(wrapper.run(pack(q, case.lens_q), pages, return_lse=lse, **scales), lse)


class PagedDecode(_Wrapped):
    name, entry, paged, decode = "flashinfer-paged-decode", "BatchDecodeWithPagedKVCacheWrapper", True, True

    def call(self, case, t):
        fi, spelling = self._module(), self.spelled(case)
        device, layout, lse = t.q.device, spelling.kv_layout, not spelling.lse
        q, cache, scales = self.paged_inputs(case, t)
        indptr, indices, last = fic.paged_metadata(cache)
        cores = {"use_tensor_cores": True} if spelling.cores else {}
        wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(self.workspace(device), layout, **cores,
                                                        backend=self.kernel_backend)
        wrapper.plan(indptr, indices, last, case.h, case.hk, case.d_qk, case.page_size, q_data_type=q.dtype,
                     kv_data_type=cache.k_cache.dtype, **self.kwargs(case))
        pages = fis.paged_cache(*fic.kv_pages(cache, layout), spelling)
        out, lse = _returned(wrapper.run(q[:, 0], pages, return_lse=lse, **scales), lse)
        keep = [n for n, count in enumerate(case.lens_q) if count]   # one row per sequence; drop those with none
        return out[keep], None if lse is None else lse[keep]


class _FP8KV:
    """Mixed into a paged wrapper's backend: FP8 KV cache cases only, the FP8 pool and its scales in the call
    (flashinfer/fp8kv.py)."""

    serves_fp8 = True

    def unsupported(self, case: Case) -> str | None:
        return first_reason(*fp8kv.fp8_refusals(case)) or super().unsupported(case)

    def fitted(self, case: Case) -> Case:
        return super().fitted(fp8kv.as_kv_cache(case))

    def paged_inputs(self, case: Case, t: Tensors) -> tuple[torch.Tensor, PagedKV, dict]:
        return t.fp8.q8.to(TORCH_DTYPES[case.dtype]), fp8_contract.fp8_pages(case, t), fp8kv.scales(t)

    def compile_key(self, case: Case) -> tuple | None:
        key = super().compile_key(case)
        return None if key is None or case.fp8 is None else (*key, case.fp8[1])


class PagedPrefillFP8KV(_FP8KV, PagedPrefill):
    name = "flashinfer-paged-prefill-fp8kv"


class PagedDecodeFP8KV(_FP8KV, PagedDecode):
    name = "flashinfer-paged-decode-fp8kv"


BACKENDS = {cls.name: cls for cls in (SinglePrefill, SingleDecode, Ragged, PagedPrefill, PagedDecode,
                                      PagedPrefillFP8KV, PagedDecodeFP8KV)}
