"""torch.nn.functional.scaled_dot_product_attention forced to one kernel: sdpa-math, sdpa-flash, sdpa-efficient and
sdpa-cudnn (on CPU: math and flash-for-CPU; on CUDA: all four).

Each run forces exactly one kernel with `sdpa_kernel([SDPBackend.X])`; torch's "No available kernel" refusal becomes
Unsupported carrying torch's own reasons. The output and the gradients (autograd; the leaves keep the inputs'
strides) come from the public call. The LSE, which the public call does not return, comes from the kernel's own
aten op called on the same inputs (math has none); a refusal there is reported in `ran`, a changed op signature is
an error.

A case is run in one of its spellings (fuzz/backends/sdpa/spelling.py); which of them the kernel takes, torch's
dispatcher says, asked once per shape on empty tensors (for the nn.MultiheadAttention spellings, on what the module's
own code hands SDPA, with its GEMMs and the kernel stubbed: fuzz/backends/sdpa/modules.py).
"""

from __future__ import annotations

import warnings
import weakref

import torch

from attnfuzz.backends.base import Backend, Unsupported, first_reason
from attnfuzz.backends.sdpa import modules
from attnfuzz.backends.sdpa.kernel_checks import kernel_refusal, refuse_kernel_check, torch_reason
from attnfuzz.backends.sdpa.spelling import (Spelling, additive_mask, aligned_bias, all_spellings, dense_mask,
                                             form_source, formed, logical_grad, parse, public_mask, same_per_head,
                                             same_per_sequence, sdpa_inputs, skeleton, spelling_names)
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

KERNELS = {"sdpa-math": "MATH", "sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION",
           "sdpa-cudnn": "CUDNN_ATTENTION"}
CUDA_ONLY = ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
KEPT_MASK_ELEMENTS = 1 << 20  # a dense mask up to this size is kept for a second run on the same inputs

# The aten op that returns the LSE, per (kernel, device type), and the argument names it is called with (by keyword,
# checked against the op's schema first, so a changed signature is an error and never a silently wrong LSE).
LSE_OPS = {
    ("FLASH_ATTENTION", "cpu"): ("_scaled_dot_product_flash_attention_for_cpu",
                                 ("query", "key", "value", "dropout_p", "is_causal", "attn_mask", "scale")),
    ("FLASH_ATTENTION", "cuda"): ("_scaled_dot_product_flash_attention",
                                  ("query", "key", "value", "dropout_p", "is_causal", "return_debug_mask", "scale")),
    ("EFFICIENT_ATTENTION", "cuda"): ("_scaled_dot_product_efficient_attention",
                                      ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p",
                                       "is_causal", "scale")),
    ("CUDNN_ATTENTION", "cuda"): ("_scaled_dot_product_cudnn_attention",
                                  ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p",
                                   "is_causal", "return_debug_mask", "scale")),
}


class SdpaBackend(Backend):
    family = "sdpa"

    def __init__(self, name: str, device: str):
        self.name, self.device, self.kernel = name, str(device), KERNELS[name]
        self.deterministic = self.kernel == "MATH"  # plain aten ops, no atomics: the same bits on every run
        if self.kernel == "EFFICIENT_ATTENTION":   # its fp32 matmuls are 3xTF32 (oracles/tolerance.py, TF32X3)
            self.family = "sdpa-efficient"
        elif self.kernel == "CUDNN_ATTENTION":  # dS rounded with the softmax scale in it (oracles/tolerance.py)
            self.family = "sdpa-cudnn"
        self._device_type = torch.device(self.device).type
        self._probed: dict[tuple, str | None] = {}
        self._kept_mask: tuple | None = None  # (the inputs, weakly; the case; the spelling; the mask)
        self._modules: dict[tuple, torch.nn.Module] = {}  # identity nn.MultiheadAttention per shape and dtype

    def _sdp(self):
        from torch.nn.attention import SDPBackend
        return getattr(SDPBackend, self.kernel)

    def version(self) -> str:
        return torch.__version__

    def available(self) -> str | None:
        if self._device_type == "cpu":
            if self.kernel in CUDA_ONLY:
                return f"{self.name} needs CUDA: torch has no CPU implementation of {self.kernel}"
            return None
        if self._device_type != "cuda" or not torch.cuda.is_available():
            return f"{self.name}: device {self.device!r} is not usable here (torch.cuda.is_available() is False)"
        return None

    # -- what SDPA can express -----------------------------------------------------------------------------------
    def unsupported(self, case: Case) -> str | None:
        reason = self._static_refusal(case)
        if reason is not None:
            return reason
        spelling = self._resolve(case)
        if spelling is None:
            return (f"spelling={case.spelling!r} is not one of {self.name}'s spellings for this case: "
                    f"{list(self.spellings(case))}")
        return self._probe(case, spelling)

    def _static_refusal(self, case: Case) -> str | None:
        """What SDPA cannot express whatever the kernel: one reason per feature."""
        return first_reason(
            (self.available() is not None, self.available() or ""),
            (case.softcap is not None, "SDPA has no logit softcap (scores are scale * q.k plus an additive mask)"),
            (case.softmax != "vanilla", f"softmax={case.softmax!r}: SDPA's softmax has no sink / off-by-one term"),
            (case.layout == "thd", "SDPA takes dense [b, h, s, d] tensors; packed thd is not expressible (padding "
                                   "goes through a mask on bshd / sbhd)"),
        )

    def spellings(self, case: Case) -> tuple[str, ...]:
        """The spellings this kernel takes for the case; the first is written ""."""
        if self._static_refusal(case) is not None:
            return ("",)
        options = all_spellings(case)
        taken = [n for n, reason in zip(spelling_names(case), self._probe_all(case, options)) if reason is None]
        return ("", *taken[1:])

    def _resolve(self, case: Case) -> Spelling | None:
        if case.spelling:
            return parse(case)
        options = all_spellings(case)
        return next((s for s, reason in zip(options, self._probe_all(case, options)) if reason is None), options[0])

    def _probe(self, case: Case, spelling: Spelling) -> str | None:
        """None when the kernel takes the spelling for the case, else torch's reason (_probe_all)."""
        return self._probe_all(case, [spelling])[0]

    def _probe_all(self, case: Case, spellings: list[Spelling]) -> list[str | None]:
        """Ask torch's dispatcher, on empty tensors of the case's shapes and strides, whether the kernel takes each
        spelling; torch's reason where it does not. causal_lower_right (sq != skv) is taken when either route
        CausalBias dispatches to is: the kernel unmasked, or the kernel given the materialized mask. Answers are
        cached per shape: probing costs more than running a small case."""
        if self.kernel == "MATH" or self.available() is not None:
            return [None] * len(spellings)
        shape = (case.b, case.sq, case.skv, case.h, case.hk, case.d_qk, case.d_v, case.dtype, case.memory,
                 case.grads, case.scale, case.storage, case.layout, same_per_head(case), same_per_sequence(case))
        missing = [s for s in spellings if (s, *shape) not in self._probed]
        if missing:
            if len(self._probed) > 100_000:
                self._probed.clear()
            answers = self._ask_within_memory(case, missing)
            if answers is None:   # not asked: the call itself refuses what the kernel does not take (run)
                return [self._probed.get((s, *shape)) for s in spellings]
            self._probed.update(zip([(s, *shape) for s in missing], answers))
        return [self._probed[(s, *shape)] for s in spellings]

    def _ask_within_memory(self, case: Case, spellings: list[Spelling]) -> list[str | None] | None:
        """_ask_dispatcher's answers, or None where the probe's empty tensors do not fit this process's GPU memory (a
        campaign lane's share, attnfuzz.engine.memshare): a long case is then probed by running it, in its worker,
        rather than ending the lane that draws it."""
        try:
            return self._ask_dispatcher(case, spellings)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            return None

    def _ask_dispatcher(self, case: Case, spellings: list[Spelling]) -> list[str | None]:
        """_probe_all's answers, asked on one skeleton of the case (its views and masks shared by the spellings)."""
        choose = getattr(torch, "_fused_sdp_choice", None)
        if choose is None:
            return [None] * len(spellings)
        q, k, v = skeleton(case, self.device)
        views, dense = {}, {}

        def mask(dtype, form=""):
            if (dtype, form) not in dense:
                dense.clear()   # one mask at a time: a long case's masks in every dtype and form need not fit at once
                heads = 1 if same_per_head(case) else case.h
                shape = (case.b, 1, 1, case.skv) if form == "mask_key_row" else (case.b, heads, case.sq, case.skv)
                dense[dtype, form] = formed(torch.empty(shape, dtype=dtype, device=self.device), case, form)
            return dense[dtype, form]

        answers = []
        with self._forced():
            for spelling in spellings:
                if spelling.module:
                    answers.append(self._module_probe(choose, case, spelling))
                    continue
                if spelling.heads not in views:
                    views[spelling.heads] = sdpa_inputs(case, q, k, v, spelling, grads=case.grads)[1]
                qh, kh, vh = views[spelling.heads]
                refused = kernel_refusal(self.kernel, spelling, qh.dtype)
                if refused is not None:
                    answers.append(refused)
                    continue
                if spelling.dense:
                    dtype = {"bool_mask": torch.bool, "float32_mask": torch.float32}.get(spelling.mask, qh.dtype)
                    routes = [(mask(dtype, spelling.form), False)]
                elif spelling.mask == "causal_lower_right" and case.sq != case.skv:
                    routes = [(None, False), (mask(torch.bool), False)]
                else:  # no_mask; is_causal, causal_upper_left and a square causal_lower_right are SDPA's causal
                    routes = [(None, spelling.mask != "no_mask")]
                answers.append(self._dispatched(choose, routes, qh, kh, vh, case, spelling))
                del routes   # its mask goes when the next spelling's is built (mask)
        return answers

    def _dispatched(self, choose, routes, q, k, v, case: Case, spelling: Spelling) -> str | None:
        """None when torch's dispatcher picks the kernel on one of the (mask, is_causal) `routes`, else its reasons."""
        reasons = []
        for mask, is_causal in routes:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    chosen = choose(q, k, v, mask, 0.0, is_causal, scale=self._scale(case, spelling),
                                    enable_gqa=spelling.heads == "enable_gqa")
                except RuntimeError as e:
                    reasons.append(torch_reason(caught, e))
                    continue
            if chosen == int(self._sdp()):
                return None
            reasons.append(f"torch's dispatcher chose backend {chosen}, not {self.kernel}")
        return f"{self.kernel} refuses spelling {spelling.name or 'plain'!r}: {' / '.join(reasons)}"

    def _module_probe(self, choose, case: Case, spelling: Spelling) -> str | None:
        """None when torch's dispatcher picks the kernel for what the module hands SDPA, else its reasons: the
        module's own code runs with its GEMMs and its SDPA call stubbed (modules.dispatch_only), so no kernel runs."""
        q, k, v = skeleton(case, self.device)
        leaves = sdpa_inputs(case, q, k, v, spelling, grads=case.grads)[0]
        mha = self._mha(case, q.dtype)
        masks = modules.module_masks(case, None, spelling, q.dtype, self.device)
        answers = []

        def ask(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            answers.append(self._dispatched(choose, [(attn_mask, is_causal)], q, k, v, case, spelling))
            return q.new_empty(*q.shape[:-1], v.shape[-1])

        with modules.dispatch_only(ask), torch.set_grad_enabled(case.grads), warnings.catch_warnings(record=True):
            modules.call(mha, *(modules.embedded(case, x) for x in leaves), masks)
        (answer,) = answers   # one SDPA call per module call, or torch's module changed
        return answer

    def _mha(self, case: Case, dtype) -> torch.nn.Module:
        """The identity nn.MultiheadAttention for the case, built once per (embed_dim, heads, dtype, batch_first)."""
        key = (case.h, case.d_qk, dtype, case.layout == "bshd")
        if key not in self._modules:
            if len(self._modules) > 64:
                self._modules.clear()
            self._modules[key] = modules.identity_mha(case, case.layout == "bshd", dtype, self.device)
        return self._modules[key]

    @staticmethod
    def _scale(case: Case, spelling: Spelling) -> float | None:
        """The scale argument: the case's, or the default's value as a number for explicit_scale."""
        return case.softmax_scale if spelling.scale == "explicit_scale" else case.scale

    def _forced(self):
        from torch.nn.attention import sdpa_kernel
        return sdpa_kernel([self._sdp()])

    # -- running -------------------------------------------------------------------------------------------------
    def run(self, case: Case, tensors: Tensors) -> Output:
        import torch.nn.functional as F

        spelling = self._resolve(case)
        if spelling is None:
            raise Unsupported(self.unsupported(case) or f"unknown spelling {case.spelling!r}")
        leaves, (qh, kh, vh) = sdpa_inputs(case, tensors.q, tensors.k, tensors.v, spelling, grads=case.grads)
        if spelling.module:
            mha = self._mha(case, qh.dtype)
            masks = modules.module_masks(case, tensors, spelling, qh.dtype, qh.device)
        else:
            mask = self._mask(case, tensors, spelling, qh.dtype, qh.device)
        with self._forced(), warnings.catch_warnings(record=True) as caught, torch.set_grad_enabled(case.grads):
            warnings.simplefilter("always")
            try:
                if spelling.module:
                    out = modules.call(mha, *(modules.embedded(case, x) for x in leaves), masks)
                else:
                    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask,
                                                         is_causal=spelling.mask == "is_causal",
                                                         scale=self._scale(case, spelling),
                                                         enable_gqa=spelling.heads == "enable_gqa")
            except RuntimeError as e:
                if "No available kernel" in str(e) or "No viable backend" in str(e):
                    raise Unsupported(f"{self.kernel} refused at call time: {torch_reason(caught, e)}") from None
                refuse_kernel_check(self.kernel, e)
                raise
        out = modules.unembedded(case, out) if spelling.module else out.transpose(1, 2)  # logical [b, sq, h, d]
        result = Output(out=out.detach(), ran=self.kernel)
        if case.grads:
            dout = tensors.dout
            try:
                grads = torch.autograd.grad(out, leaves, dout)
            except RuntimeError as e:
                refuse_kernel_check(self.kernel, e)
                raise
            lengths = (case.sq, case.skv, case.skv)
            result.dq, result.dk, result.dv = (logical_grad(case, g, s) for g, s in zip(grads, lengths))
        if spelling.module:
            result.ran = f"{self.kernel} (through nn.MultiheadAttention; no lse: the module returns none)"
            return result
        with torch.no_grad():
            result.lse, note = self._lse(case, tensors, spelling, qh, kh, vh)
        result.ran = f"{self.kernel} ({note})"
        return result

    def _mask(self, case: Case, tensors: Tensors, spelling: Spelling, dtype, device):
        """_public_mask, built once for two runs on the same inputs (the harness's bitwise rerun) where it is small:
        the mask is attnfuzz's, not the kernel's, and building it costs more than a small case's kernel."""
        kept = self._kept_mask
        if kept is not None and kept[0]() is tensors and kept[1] is case and kept[2] == spelling:
            return kept[3]
        mask = public_mask(case, tensors, spelling, dtype, device)
        small = type(mask) is torch.Tensor and mask.numel() <= KEPT_MASK_ELEMENTS
        self._kept_mask = (weakref.ref(tensors), case, spelling, mask) if small else None
        return mask

    def repro_source(self, case: Case) -> str | None:
        """Source of `attention(q, k, v)` calling SDPA as run() does, for standalone repro scripts (fuzz/store/repro.py),
        in every spelling and layout SDPA takes; None for a case it refuses."""
        spelling = self._resolve(case)
        unavailable = self.available()  # a CUDA entry's script is written on any machine
        refused = self._static_refusal(case)
        if spelling is None or (refused is not None and refused != unavailable):
            return None
        from attnfuzz.backends.source import written_mask
        from attnfuzz.strategies.materialize import materialize, torch_dtype
        t = materialize(case, "cpu")
        if spelling.module:
            return modules.repro_source(case, spelling, self.kernel, t)
        masks = {"no_mask": "None", "is_causal": "None",
                 "causal_upper_left": f"torch.nn.attention.bias.causal_upper_left({case.sq}, {case.skv})",
                 "causal_lower_right": f"torch.nn.attention.bias.causal_lower_right({case.sq}, {case.skv})"}
        rebuilt = ""
        if spelling.dense:   # a mask too large to write out is rebuilt from the seed, as such a case's inputs are
            masks[spelling.mask], rebuilt = written_mask(dense_mask(case, t, spelling, torch_dtype(case), "cpu"),
                                                         "attnfuzz.backends.sdpa.spelling", "regenerated_mask",
                                                         f"CASE, {spelling.name!r}")
        shaped = (f"    mask = {form_source(case, spelling.form).replace('MASK', 'mask')}\n"
                  if spelling.dense and spelling.form else "")  # on the device: a copy keeps no stride-0 view
        view = ("x.transpose(0, 1).contiguous().permute(1, 2, 0, 3)" if case.layout == "sbhd"  # seq-major buffers
                else "x.transpose(1, 2)")
        bias_import = "import torch.nn.attention.bias\n\n" if spelling.mask.startswith("causal_") else ""
        return (f"\n{bias_import}{rebuilt}"
                f"MASK = {masks[spelling.mask]}  # attn_mask: True / 0 = query i may see key j\n\n\n"
                f"def attention(q, k, v):\n"
                f"    \"\"\"torch SDPA forced to {self.kernel}, spelled {spelling.name!r}, layout {case.layout}.\"\"\"\n"
                "    from torch.nn.attention import SDPBackend, sdpa_kernel\n"
                f"    q, k, v = ({view} for x in (q, k, v))\n"
                + ("    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))\n"
                   if spelling.heads == "repeat_kv" else "")
                + "    mask = MASK.to(q.device) if isinstance(MASK, torch.Tensor) else MASK\n"
                + shaped
                + f"    with sdpa_kernel([SDPBackend.{self.kernel}]):\n"
                "        out = torch.nn.functional.scaled_dot_product_attention(\n"
                f"            q, k, v, attn_mask=mask, is_causal={spelling.mask == 'is_causal'}, "
                f"scale={self._scale(case, spelling)!r}, "
                f"enable_gqa={spelling.heads == 'enable_gqa'})\n"
                f"    return out.transpose(1, 2)\n")

    def _lse(self, case: Case, tensors: Tensors, spelling: Spelling, q, k, v) -> tuple[torch.Tensor | None, str]:
        """LSE [b, h, sq] from the kernel's aten op on the same inputs, and a note for `ran`."""
        entry = LSE_OPS.get((self.kernel, self._device_type))
        if entry is None:
            return None, "no lse: the kernel's op does not return one"
        name, expected = entry
        op = getattr(torch.ops.aten, name).default
        got = tuple(a.name for a in op._schema.arguments)
        if got != expected:
            raise RuntimeError(f"{self.name}: aten::{name} takes {got} in torch {torch.__version__}, the adapter "
                               f"calls it with {expected}; update LSE_OPS in fuzz/backends/sdpa/adapter.py")
        if k.shape[1] != q.shape[1]:  # the ops take no GQA; k / v may already be repeated (spelling repeat_kv)
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
        is_causal = spelling.mask in ("is_causal", "causal_upper_left")
        bias = None
        if spelling.mask == "causal_lower_right" and self._device_type == "cuda" and self.kernel == "FLASH_ATTENTION":
            is_causal = True  # the aten flash op's causal is bottom-right (torch/nn/attention/bias.py does the same)
        elif spelling.dense or spelling.mask == "causal_lower_right":
            bias = additive_mask(case, tensors, q.dtype, q.device)
        kwargs = {"query": q, "key": k, "value": v, "dropout_p": 0.0, "is_causal": is_causal,
                  "scale": case.softmax_scale}
        if "attn_mask" in expected:
            kwargs["attn_mask"] = bias
        elif "attn_bias" in expected:
            kwargs.update(attn_bias=aligned_bias(bias, case.h) if bias is not None else None, compute_log_sumexp=True)
        elif bias is not None:
            return None, f"no lse: aten::{name} takes no mask"
        if "return_debug_mask" in expected:
            kwargs["return_debug_mask"] = False
            if q.shape[-1] % 8 or v.shape[-1] % 8:  # the op wants head dims padded to 8, as the public path does
                q, k, v = (torch.nn.functional.pad(x, (0, -x.shape[-1] % 8)) for x in (q, k, v))
                kwargs.update(query=q, key=k, value=v)
        try:
            lse = op(**kwargs)[1]
        except RuntimeError as e:
            return None, f"no lse: aten::{name} raised {str(e).splitlines()[0][:160]}"
        if lse.dim() == 4 and lse.shape[-1] == 1:
            lse = lse.squeeze(-1)
        if lse.dim() != 3 or tuple(lse.shape[:2]) != (case.b, case.h) or lse.shape[2] < case.sq:
            raise RuntimeError(f"{self.name}: aten::{name} returned an LSE of shape {tuple(lse.shape)}; the adapter "
                               f"expects [b={case.b}, h={case.h}, >= sq={case.sq}]")
        return lse[..., :case.sq], f"lse from aten::{name}"


BACKENDS = {name: (lambda device, name=name: SdpaBackend(name, device)) for name in KERNELS if name != "sdpa-cudnn"}
# sdpa-cudnn is registered by fuzz/backends/sdpa/cudnn.py, which adds the key of its execution graphs
