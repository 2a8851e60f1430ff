"""The variations bench/verify_findings.py runs: the first H200 run's shrunk case of each finding, and the changes
(contiguous copies, FA4 called directly, TE's own helpers probed, rules bypassed) that tell an adapter mistake from a
backend bug, each with the verdict it predicts."""

from __future__ import annotations

import importlib
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnfuzz.strategies.case import Case  # noqa: E402

TE_BACKENDS = "transformer_engine.pytorch.attention.dot_product_attention.backends"
TE_UTILS = "transformer_engine.pytorch.attention.dot_product_attention.utils"
FP16 = dict(dtype="float16")
FIRST_RUN = {  # finding -> (corpus file-name prefix, the first H200 run's shrunk case the variations were built on)
    "F1": ("fa4-CRASH-AssertionError", Case(sq=1, skv=1, h=2, d_qk=8, d_v=16, grads=True, **FP16)),
    "F2": ("fa4-CRASH-MLIRError", Case(sq=1, skv=1, d_qk=32, d_v=8, grads=True, **FP16)),
    "F3": ("fa4-FAIL-ALL_ZERO", Case(sq=1, skv=1, d_qk=8, d_v=8, causal=True, spelling="neg", **FP16)),
    "F4": ("te-flash-FAIL-ALL_ZERO", Case(sq=1, skv=1, d_qk=8, d_v=8, causal=True, alignment="bottom_right", **FP16)),
    "F5": ("te-flash-FAIL-GRADIENT", Case(sq=65, skv=65, d_qk=8, d_v=8, alignment="bottom_right", grads=True,
                                          **FP16)),
    "F6": ("te-fused-FAIL-TOLERANCE", Case(sq=2, skv=2, h=2, d_qk=8, d_v=8, memory="transposed", **FP16)),
    "F7": ("te-unfused-FAIL-TOLERANCE", Case(sq=3, skv=1, d_qk=8, d_v=8, spelling="padding", **FP16)),
    "F8": ("te-unfused-FAIL-ALL_ZERO", Case(sq=3, skv=1, h=2, d_qk=100, d_v=100, mask_density=0.1,
                                            softmax="off_by_one", seed=1, **FP16)),
    "F9": ("te-unfused-CRASH-RuntimeError", Case(sq=1, skv=1, d_qk=8, d_v=8, seqlens_q=(0,), seqlens_kv=(1,),
                                                 layout="thd", **FP16)),
    # not in the corpus: a second TOLERANCE cluster of te-unfused (learnable sink + padded keys + a finite window
    # spelling), the first run's case; and a plain case for checking declared refusals against the library
    "X1": ("", Case(sq=1, skv=63, h=4, hk=1, d_qk=96, d_v=24, dtype="bfloat16", seqlens_q=(1,), seqlens_kv=(3,),
                    alignment="bottom_right", softmax="learnable", memory="transposed", seed=228037535, grads=True,
                    spelling="wide")),
    "R": ("", Case(sq=16, skv=16, h=2, **FP16)),
}
HEADLINES = {
    "F1": "fa4 GQA backward with d_qk != d_v: verdict (a), FA4 asserts it; now declared by the adapter",
    "F2": "fa4 sm90 backward MLIRError for d_qk > d_v: verdict (c), predicted to fail iff d_v's tile is narrower "
          "than the dO swizzle atom sized from d_qk",
    "F3": "fa4 'neg' spellings: verdict (c), seed-003: FA4 reads a literal (-1, 0) as an empty band",
    "F4": "te-flash causal all-zero: verdict (c), TE hands FA4 window (-1, 0)",
    "F5": "te-flash dq rows >= 64 zero: verdict (c), FA4 sm90 backward pads d to 16 in the kernel but to 32 for "
          "dq_accum",
    "F6": "te-fused strided views: verdict (c), TE reads head-major views as bshd_bshd_bshd",
    "F7": "te-unfused 'padding' row 2 zero: verdict (c), TE unfused turns (-1, -1) into window (skv, sq), wrong at "
          "top-left with sq != skv",
    "F8": "te-unfused explicit-mask all-zero: verdict (c), same TE window as F7",
    "F9": "te-unfused thd with no query token: verdict (c), a crash in TE's reshape, only when total q tokens = 0",
    "X1": "te-unfused learnable sink + padded keys (uncorpused cluster): no verdict yet, exploration only",
    "R": "declared refusals, checked against the library with the adapter's rules bypassed",
}


@dataclass(frozen=True)
class Variation:
    """One targeted run: `runner(case, device) -> (label, ratio, note)` on the finding's case changed by
    `change`; `expect` is the predicted label prefix (None: no prediction)."""

    finding: str
    group: str
    name: str
    runner: Callable
    change: dict = field(default_factory=dict)
    expect: str | None = None


# -- runners -----------------------------------------------------------------------------------------------------
def _graded(case: Case, tensors, output, family: str, device: str) -> tuple[str, float, str]:
    from attnfuzz.oracles.grade import Oracle, grade

    verdict = grade(case, tensors, output, family=family, oracle=Oracle.of(case, tensors, device=device))
    note = output.ran
    if verdict.diagnosis == "GRADIENT" and output.dq is not None:
        note += f"; dq rows all 0 where the oracle's are not: {_zero_rows(output.dq, tensors, case)}"
    if verdict.status != "PASS":
        note += f"; {verdict.message[:150]}"
    return verdict.label, verdict.ratio, note


def _zero_rows(dq, tensors, case: Case) -> str:
    """The query rows whose dq is exactly 0 where the oracle's is not, as 'count rows, first..last'."""
    from attnfuzz.oracles.reference import reference

    ref = reference(case, tensors, device=dq.device).dq
    rows = ((dq.abs().amax(dim=(2, 3)) == 0) & (ref.abs().amax(dim=(2, 3)) > 0)).any(0).nonzero().flatten().tolist()
    return f"{len(rows)} rows, {rows[0]}..{rows[-1]} of {case.sq}" if rows else "none"


def adapter(name: str, *, contiguous: bool = False, bypass_rules: bool = False, record: bool = False,
            normalize_fa4_window: bool = False, invert_padding_mask: bool = False) -> Callable:
    """Run the case through attnfuzz's adapter `name`, optionally with contiguous copies of q/k/v, with the adapter's
    capability rules bypassed (the library refuses or not by itself), with TE's FA4 calls recorded or their negative
    window bounds normalised to None, or with the padding masks handed to TE inverted (True = keep)."""
    def run(case: Case, device: str):
        from attnfuzz.backends import get
        from attnfuzz.backends.te import adapter as te_adapter
        from attnfuzz.strategies.materialize import materialize

        backend = get(name, device)
        why = backend.available() if str(device).startswith("cuda") else None
        if why:
            return "UNAVAILABLE", None, why
        if not bypass_rules:
            reason = backend.unsupported(case)
            if reason:
                return "UNSUPPORTED", None, reason
        t = materialize(case, device)
        if contiguous:
            t = type(t)(t.q.contiguous(), t.k.contiguous(), t.v.contiguous(), t.mask, t.sink, t.alibi, t.dout)
        calls: list = []
        with ExitStack() as patches:
            if bypass_rules:
                patches.enter_context(_patched(te_adapter, "capability_refusals", lambda *a, **k: []))
            if record or normalize_fa4_window:
                patches.enter_context(_te_fa4_calls(calls, normalize_fa4_window))
            if invert_padding_mask:
                patches.enter_context(_inverted_masks(te_adapter))
            output = backend.run(case, t)
        label, ratio, note = _graded(case, t, output, backend.family, device)
        return label, ratio, (f"TE called {calls}; " if calls else "") + note
    return run


def fa4_direct(causal: bool, window: tuple) -> Callable:
    """flash_attn.cute.flash_attn_func on the case's bshd tensors, no adapter in between."""
    def run(case: Case, device: str):
        import torch

        from attnfuzz.oracles.verdict import Output
        from attnfuzz.strategies.materialize import materialize

        if case.layout != "bshd" or case.padded:
            raise ValueError(f"fa4_direct takes unpadded bshd cases, got layout={case.layout!r}")
        api = importlib.import_module("flash_attn.cute")
        t = materialize(case, device)
        leaves = [x.detach().requires_grad_(case.grads) for x in (t.q, t.k, t.v)]
        out, lse = api.flash_attn_func(*leaves, softmax_scale=case.scale, causal=causal, window_size=window,
                                       return_lse=True)
        grads = torch.autograd.grad(out, leaves, t.dout) if case.grads else (None, None, None)
        output = Output(out.detach(), lse.detach().float(), *grads, ran=f"flash_attn_func(causal={causal}, "
                                                                         f"window_size={window})")
        return _graded(case, t, output, "fa4", device)
    return run


def te_vs_fa4_dq(case: Case, device: str):
    """dq of te-flash next to dq of FA4 called directly on the same tensors: equal means TE adds nothing to it."""
    import torch

    from attnfuzz.backends import get
    from attnfuzz.strategies.materialize import materialize

    t = materialize(case, device)
    te_dq = get("te-flash", device).run(case, t).dq
    leaves = [x.detach().requires_grad_(True) for x in (t.q, t.k, t.v)]
    out, _ = importlib.import_module("flash_attn.cute").flash_attn_func(*leaves, causal=False, return_lse=True)
    fa4_dq = torch.autograd.grad(out, leaves, t.dout)[0]
    diff = (te_dq.double() - fa4_dq.double()).abs().max().item()
    return ("SAME" if diff == 0 else "DIFFERENT"), None, (f"max |dq(te-flash) - dq(fa4 direct)| = {diff:.3g}; zero "
                                                         f"rows te {_zero_rows(te_dq, t, case)}, fa4 "
                                                         f"{_zero_rows(fa4_dq, t, case)}")


def probe_qkv_layout(case: Case, device: str):
    """What TE's get_qkv_layout makes of the case's q/k/v views, and their strides against bshd's."""
    from attnfuzz.strategies.materialize import materialize

    t = materialize(case, device)
    layout = importlib.import_module(TE_UTILS).get_qkv_layout(t.q, t.k, t.v, qkv_format="bshd")[0]
    canonical = t.q.contiguous().stride()
    label = "MISREAD" if layout == "bshd_bshd_bshd" and t.q.stride() != canonical else "OK"
    return label, None, f"layout={layout!r}; q.stride()={t.q.stride()} vs bshd {canonical}"


def probe_full_mask(case: Case, device: str):
    """TE's get_full_mask for a padding mask with no window, at both diagonal alignments: which query rows it hides."""
    import torch

    utils = importlib.import_module(TE_UTILS)
    pad_q = torch.zeros(1, 1, 1, case.sq, dtype=torch.bool, device=device)
    pad_k = torch.zeros(1, 1, 1, case.skv, dtype=torch.bool, device=device)
    hidden = {}
    for bottom_right in (False, True):
        _, mask, _, _ = utils.get_full_mask(case.sq, case.skv, attn_mask_type="padding", attention_mask=(pad_q, pad_k),
                                            window_size=(-1, -1), attention_type="cross",
                                            bottom_right_alignment=bottom_right)
        hidden[bottom_right] = [int(i) for i in mask[0, 0].all(-1).nonzero().flatten()]
    label = "SPURIOUS" if hidden[False] and not hidden[True] else "CLEAN"
    return label, None, f"rows with every key hidden: top-left {hidden[False]}, bottom-right {hidden[True]}"


@contextmanager
def _patched(obj, name: str, value):
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


@contextmanager
def _te_fa4_calls(calls: list, normalize: bool):
    """Record what TE hands FA4 (and with `normalize`, pass negative window bounds as None, the seed-003 fix)."""
    backends = importlib.import_module(TE_BACKENDS)
    saved = {n: getattr(backends, n) for n in ("flash_attn_func_v4", "flash_attn_varlen_func_v4")}

    def wrap(fn):
        def call(*args, **kwargs):
            window = kwargs.get("window_size")
            calls.append({"causal": kwargs.get("causal"), "window_size": window})
            if normalize and window is not None:
                kwargs["window_size"] = tuple(None if w is not None and w < 0 else w for w in window)
            return fn(*args, **kwargs)
        return call

    for n, fn in saved.items():
        if fn is not None:
            setattr(backends, n, wrap(fn))
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(backends, n, fn)


@contextmanager
def _inverted_masks(te_adapter):
    """te_call with its padding masks inverted: the opposite convention (True = a token to keep)."""
    honest = te_adapter.te_call

    def inverted(case, t, backend):
        init, args, kwargs = honest(case, t, backend)
        mask = kwargs.get("attention_mask")
        if isinstance(mask, tuple):
            kwargs["attention_mask"] = tuple(~m for m in mask)
        elif mask is not None:
            kwargs["attention_mask"] = ~mask
        return init, args, kwargs

    with _patched(te_adapter, "te_call", inverted):
        yield


# -- the variations ----------------------------------------------------------------------------------------------
def variations() -> list[Variation]:
    V, F, U, T = Variation, "te-flash", "te-unfused", "te-fused"
    big = dict(sq=128, skv=128, h=2)
    return [
        V("F7", U, "as-is ('padding', top-left, sq=3 > skv=1)", adapter(U), {}, "FAIL"),
        V("F7", U, "alignment bottom_right (same math: no band)", adapter(U), dict(alignment="bottom_right"), "PASS"),
        V("F7", U, "spelling '' (no_mask): not padding-specific", adapter(U), dict(spelling=""), "FAIL"),
        V("F7", U, "spelling 'wide' (finite window covering all)", adapter(U), dict(spelling="wide"), "PASS"),
        V("F7", U, "TE get_full_mask probe", probe_full_mask, {}, "SPURIOUS"),
        V("F7", U, "attention_mask, TE convention (True = pad), br", adapter(U),
          dict(seqlens_q=(3,), seqlens_kv=(1,), spelling="attention_mask", alignment="bottom_right"), "PASS"),
        V("F7", U, "attention_mask inverted (True = keep), br", adapter(U, invert_padding_mask=True),
          dict(seqlens_q=(3,), seqlens_kv=(1,), spelling="attention_mask", alignment="bottom_right"), "FAIL"),
        V("F7", T, "te-fused, same case", adapter(T), {}, "PASS"),
        V("F8", U, "as-is (off_by_one, explicit mask, sq=3 > skv=1)", adapter(U), {}, "FAIL:ALL_ZERO"),
        V("F8", U, "alignment bottom_right (same math)", adapter(U), dict(alignment="bottom_right"), "PASS"),
        V("F8", U, "mask density 1.0: the explicit mask is not the cause", adapter(U), dict(mask_density=1.0),
          "FAIL"),
        V("F8", U, "sq = skv = 3, mask density 0.7", adapter(U), dict(skv=3, mask_density=0.7), "PASS"),
        V("F9", U, "as-is (thd, seqlens_q=(0,))", adapter(U), {}, "CRASH:RuntimeError"),
        V("F9", U, "b=2, seqlens_q=(0, 1): one empty sequence", adapter(U),
          dict(b=2, seqlens_q=(0, 1), seqlens_kv=(1, 1)), "PASS"),
        V("F9", T, "te-fused, same case", adapter(T), {}, "UNSUPPORTED"),
        V("X1", U, "as-is", adapter(U), {}, None),
        V("X1", U, "softmax off_by_one", adapter(U), dict(softmax="off_by_one"), None),
        V("X1", U, "softmax vanilla", adapter(U), dict(softmax="vanilla"), None),
        V("X1", U, "memory contiguous", adapter(U), dict(memory="contiguous"), None),
        V("X1", U, "d_v = d_qk = 96", adapter(U), dict(d_v=96), None),
        V("X1", U, "spelling '' (padding mask type, no window)", adapter(U), dict(spelling=""), None),
        V("F6", T, "as-is (transposed views, h=2, hk=1)", adapter(T), {}, "FAIL"),
        V("F6", T, "same values, .contiguous()", adapter(T, contiguous=True), {}, "PASS"),
        V("F6", T, "TE get_qkv_layout probe", probe_qkv_layout, {}, "MISREAD"),
        V("F6", T, "h = hk = 2: not GQA-specific", adapter(T), dict(hk=2), "FAIL"),
        V("F6", T, "sq = skv = 1 (views coincide with bshd)", adapter(T), dict(sq=1, skv=1), "PASS"),
        V("F6", U, "te-unfused, same views", adapter(U), {}, "PASS"),
        V("R", T, "te-fused d=(12, 16), rules bypassed", adapter(T, bypass_rules=True), dict(d_qk=12, d_v=16),
          "UNSUPPORTED"),
        V("F4", F, "as-is (causal, bottom-right, sq=skv=1)", adapter(F, record=True), {}, "FAIL:ALL_ZERO"),
        V("F4", F, "sq=skv=128, h=2", adapter(F, record=True), big, "FAIL:ALL_ZERO"),
        V("F4", F, "sq=skv=128, TE's -1 bounds passed as None", adapter(F, normalize_fa4_window=True), big, "PASS"),
        V("F4", F, "sq=skv=128, spelling 'window' (no_mask + (wide, 0))", adapter(F, record=True),
          dict(big, spelling="window"), "PASS"),
        V("F6", F, "te-flash, same views as F6", adapter(F), {}, "PASS"),
        V("F5", F, "as-is (sq=skv=65, d=8, fp16)", adapter(F, record=True), {}, "FAIL:GRADIENT"),
        V("F5", F, "dq of te-flash vs FA4 direct", te_vs_fa4_dq, {}, "SAME"),
        V("R", F, "te-flash d=(1, 1), rules bypassed", adapter(F, bypass_rules=True), dict(d_qk=1, d_v=1),
          "UNSUPPORTED"),
        V("F1", "fa4", "as-is through the adapter", adapter("fa4"), {}, "UNSUPPORTED"),
        V("F1", "fa4", "FA4 direct: the library's own assert", fa4_direct(False, (None, None)), {}, "CRASH:Assertion"),
        V("F1", "fa4", "FA4 direct, hk = h (MHA) with d_qk != d_v", fa4_direct(False, (None, None)), dict(hk=2),
          "PASS"),
        V("F3", "fa4", "as-is (spelling 'neg')", adapter("fa4"), {}, "FAIL:ALL_ZERO"),
        V("F3", "fa4", "direct causal, (-1, 0), 128x128", fa4_direct(True, (-1, 0)), big, "FAIL:ALL_ZERO"),
        V("F3", "fa4", "direct causal, (None, None), 128x128", fa4_direct(True, (None, None)), big, "PASS"),
        V("F3", "fa4", "direct causal, (-1, -1) (both negative), 128x128", fa4_direct(True, (-1, -1)), big, "PASS"),
        V("F5", "fa4", "FA4 direct, d=8, sq=65", fa4_direct(False, (None, None)), {}, "FAIL:GRADIENT"),
        V("F5", "fa4", "FA4 direct, d=8, sq=64", fa4_direct(False, (None, None)), dict(sq=64, skv=64), "PASS"),
        V("F5", "fa4", "FA4 direct, d=16, sq=65 (tile 16, accum 32)", fa4_direct(False, (None, None)),
          dict(d_qk=16, d_v=16), "FAIL:GRADIENT"),
        V("F5", "fa4", "FA4 direct, d=32, sq=65 (tile 32, accum 32)", fa4_direct(False, (None, None)),
          dict(d_qk=32, d_v=32), "PASS"),
        V("F5", "fa4", "FA4 direct, d=40, sq=65 (tile 48, accum 64)", fa4_direct(False, (None, None)),
          dict(d_qk=40, d_v=40), "FAIL:GRADIENT"),
        V("F5", "fa4", "FA4 direct, d=72, sq=65 (tile 80, accum 96)", fa4_direct(False, (None, None)),
          dict(d_qk=72, d_v=72), "FAIL:GRADIENT"),
        V("F2", "fa4", "as-is (d_qk=32, d_v=8, grads)", adapter("fa4"), {}, "CRASH:MLIRError"),
        V("F2", "fa4", "forward only", adapter("fa4"), dict(grads=False), "PASS"),
        V("F2", "fa4", "d=(32, 16): atom 32 > tile 16", adapter("fa4"), dict(d_v=16), "CRASH:MLIRError"),
        V("F2", "fa4", "d=(64, 32): atom 64 > tile 32", adapter("fa4"), dict(d_qk=64, d_v=32), "CRASH:MLIRError"),
        V("F2", "fa4", "d=(48, 16): atom 16 = tile 16, no compile error", adapter("fa4"), dict(d_qk=48, d_v=16),
          "!CRASH:MLIRError"),
    ]
