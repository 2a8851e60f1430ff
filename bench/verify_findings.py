"""Targeted GPU checks that separate adapter mistakes from backend bugs in the first H200 findings (FA4, TE).

    python3 bench/verify_findings.py --findings .gpu-findings/single/corpus --out DIR [--only F5,F6] [--budget-s 210]

For each finding the first run's shrunk case (built in, and checked against its corpus file in --findings: a
missing or different file is reported on the line) runs as-is and with the variations that tell the two apart: the
same values made contiguous, FA4 called directly next to TE's call of it, the other diagonal alignment where it
changes nothing in the math, TE's own mask helpers probed directly, both padding-mask conventions, the adapter's
capability rules bypassed so the library's own refusal shows. Every run is graded against the float64 oracle
(oracles.grade). One line per variation: finding, group, variation, verdict label, ratio, whether it came out as
predicted, what ran. Variations run in one child process per group (te-unfused, te-fused, te-flash, fa4), so a CUDA
fault in one group cannot stop the others; every exception is recorded, never raised; a group past its share of the
budget (the whole, less what the groups after it reserve) skips what is left. Writes DIR/verify.jsonl and
DIR/summary.txt.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
import traceback
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strategies.case import Case  # noqa: E402

GROUPS = ("te-unfused", "te-fused", "te-flash", "fa4")       # run order; fa4 compiles most, it goes last
RESERVE_S = {"te-unfused": 25, "te-fused": 20, "te-flash": 45, "fa4": 90}   # kept for each group still to run
GRACE_S = 30          # past a group's share before a silent child is killed...
HARD_MARGIN_S = 15    # ...but never later than this past the whole budget (the run stays under 4 minutes)
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
    from oracles.grade import Oracle, grade

    verdict = grade(case, tensors, output, family=family, oracle=Oracle.of(case, tensors, device=device))
    note = output.ran
    if verdict.diagnosis == "GRADIENT" and output.dq is not None:
        note += f"; dq rows all 0 where the oracle's are not: {_zero_rows(output.dq, tensors, case)}"
    if verdict.status != "PASS":
        note += f"; {verdict.message[:150]}"
    return verdict.label, verdict.ratio, note


def _zero_rows(dq, tensors, case: Case) -> str:
    """The query rows whose dq is exactly 0 where the oracle's is not, as 'count rows, first..last'."""
    from oracles.reference import reference

    ref = reference(case, tensors, device=dq.device).dq
    rows = ((dq.abs().amax(dim=(2, 3)) == 0) & (ref.abs().amax(dim=(2, 3)) > 0)).any(0).nonzero().flatten().tolist()
    return f"{len(rows)} rows, {rows[0]}..{rows[-1]} of {case.sq}" if rows else "none"


def adapter(name: str, *, contiguous: bool = False, bypass_rules: bool = False, record: bool = False,
            normalize_fa4_window: bool = False, invert_padding_mask: bool = False) -> Callable:
    """Run the case through attnfuzz's adapter `name`, optionally with contiguous copies of q/k/v, with the adapter's
    capability rules bypassed (the library refuses or not by itself), with TE's FA4 calls recorded or their negative
    window bounds normalised to None, or with the padding masks handed to TE inverted (True = keep)."""
    def run(case: Case, device: str):
        from fuzz.backends import get
        from fuzz.backends import transformer_engine as te_adapter
        from strategies.materialize import materialize

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

        from oracles.verdict import Output
        from strategies.materialize import materialize

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

    from fuzz.backends import get
    from strategies.materialize import materialize

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
    from strategies.materialize import materialize

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


# -- running -----------------------------------------------------------------------------------------------------
def base_case(finding: str, findings: Path) -> tuple[Case, str]:
    """The first run's case of `finding` and a note on the corpus file in --findings: the variations were designed
    around these cases, so a corpus case that differs is reported, not silently used."""
    prefix, case = FIRST_RUN[finding]
    if not prefix:
        return case, "case: built in"
    files = sorted(findings.glob(f"{prefix}-*.json"))
    if not files:
        return case, f"no {prefix}-*.json in --findings, ran the first run's case"
    found = Case.from_dict(json.loads(files[0].read_text()).get("case"), where=str(files[0]))
    return case, (f"case: {files[0].name}" if found == case else
                  f"{files[0].name} holds {found!r}, not the first run's case: ran the first run's")


def outcome(label: str, expect: str | None) -> str:
    if label in ("UNAVAILABLE", "SKIPPED", "NOT RUN", "HANG/DIED"):
        return "not run"
    if expect is None:
        return "(no prediction)"
    hit = not label.startswith(expect[1:]) if expect.startswith("!") else label.startswith(expect)
    return "as predicted" if hit else f"NOT AS PREDICTED ({expect})"


def run_variation(v: Variation, findings: Path, device: str) -> dict:
    """One variation, every exception recorded: CRASH:<type> (at file:line), Unsupported as UNSUPPORTED."""
    row = {"finding": v.finding, "group": v.group, "variation": v.name, "label": "", "ratio": None, "note": ""}
    start = time.perf_counter()
    try:
        base, row["source"] = base_case(v.finding, findings)
        case = base.replace(**v.change)
        row["case"] = case.to_dict()
        label, ratio, note = v.runner(case, device)
        row.update(label=label, ratio=ratio, note=note)
    except Exception as e:  # recorded, never raised: the run goes on
        where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        if type(e).__name__ == "Unsupported":
            row.update(label="UNSUPPORTED", note=str(e)[:300])
        elif isinstance(e, ImportError):
            row.update(label="UNAVAILABLE", note=f"{e} (the library does not import here)")
        else:
            at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
            row.update(label=f"CRASH:{type(e).__name__}", note=f"{str(e)[:300]}{at}")
    row["outcome"] = outcome(row["label"], v.expect)
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def line(row: dict) -> str:
    ratio = "" if row.get("ratio") is None else f"ratio={row['ratio']:.3g}"
    source = row.get("source", "")
    note = " ".join(str(row.get("note", "")).split())[:260] + ("" if source.startswith("case:") else f" [{source}]")
    return (f"{row['finding']:<3} {row['group']:<10} {row['variation'][:52]:<52} {row['label'][:24]:<24} "
            f"{ratio:<13} {row['outcome']:<34} {note}")


def child(group: str, findings: Path, out: Path, deadline: float, device: str, only: set[str]) -> None:
    """Run one group's variations in order, appending each row to out/verify.jsonl as it finishes."""
    for v in variations():
        if v.group != group or (only and v.finding not in only):
            continue
        if time.time() > deadline:
            row = {"finding": v.finding, "group": group, "variation": v.name, "label": "SKIPPED", "ratio": None,
                   "note": "over the group's share of the budget", "outcome": "not run"}
        else:
            (out / f"{group}.inflight").write_text(json.dumps({"finding": v.finding, "variation": v.name}))
            row = run_variation(v, findings, device)
        with (out / "verify.jsonl").open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(line(row), flush=True)
    (out / f"{group}.inflight").unlink(missing_ok=True)


def record_lost(out: Path, group: str, only: set[str], failure: str) -> None:
    """Rows for a child that died or hung: HANG/DIED for the variation in flight, NOT RUN for those after it."""
    path, inflight = out / "verify.jsonl", out / f"{group}.inflight"
    done = {(r["finding"], r["variation"]) for r in map(json.loads, path.read_text().splitlines())} \
        if path.exists() else set()
    lost = json.loads(inflight.read_text()) if inflight.exists() else {}
    inflight.unlink(missing_ok=True)
    for v in variations():
        if v.group != group or (only and v.finding not in only) or (v.finding, v.name) in done:
            continue
        in_flight = (v.finding, v.name) == (lost.get("finding"), lost.get("variation"))
        row = {"finding": v.finding, "group": group, "variation": v.name, "ratio": None, "outcome": "not run",
               "label": "HANG/DIED" if in_flight else "NOT RUN", "note": failure if in_flight else "after it"}
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(line(row), flush=True)


def summarize(out: Path) -> str:
    rows = [json.loads(x) for x in (out / "verify.jsonl").read_text().splitlines()] if (out / "verify.jsonl").exists() \
        else []
    text = []
    for finding in sorted({r["finding"] for r in rows}, key=lambda f: (f[0], int(f[1:]) if f[1:].isdigit() else 0)):
        mine = [r for r in rows if r["finding"] == finding]
        hits = sum(r["outcome"] == "as predicted" for r in mine)
        predicted = sum(r["outcome"] not in ("", "(no prediction)", "not run") for r in mine)
        text.append(f"== {finding}: {HEADLINES.get(finding, '')}")
        not_run = sum(r["outcome"] == "not run" for r in mine)
        text.append(f"   {hits} of {predicted} predictions held" + (f", {not_run} not run" if not_run else ""))
        text += ["   " + line(r) for r in mine]
    return "\n".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--findings", type=Path, required=True, help="corpus folder of the run (shrunk cases)")
    parser.add_argument("--out", type=Path, required=True, help="folder for verify.jsonl and summary.txt")
    parser.add_argument("--only", default="", help="comma-separated findings, e.g. F5,F6 (default: all)")
    parser.add_argument("--budget-s", type=float, default=210.0,
                        help="wall-clock budget; a hung group is killed at most HARD_MARGIN_S past it")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    only = {f.strip() for f in args.only.split(",") if f.strip()}
    if not args.findings.is_dir():
        parser.error(f"--findings={args.findings}: not a folder; pass the corpus folder of the GPU run")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args.child, args.findings, args.out, args.deadline, args.device, only)
        return
    (args.out / "verify.jsonl").unlink(missing_ok=True)
    end = time.time() + args.budget_s
    groups = [g for g in GROUPS if any(v.group == g and (not only or v.finding in only) for v in variations())]
    for i, group in enumerate(groups):
        deadline = max(end - sum(RESERVE_S[g] for g in groups[i + 1:]), time.time() + 10.0)
        cmd = [sys.executable, __file__, "--child", group, "--findings", str(args.findings), "--out", str(args.out),
               "--deadline", str(deadline), "--device", args.device, "--only", args.only]
        try:
            done = subprocess.run(cmd, timeout=max(min(deadline + GRACE_S, end + HARD_MARGIN_S) - time.time(), 1.0))
            failure = None if done.returncode == 0 else f"the {group} child process exited {done.returncode}"
        except subprocess.TimeoutExpired:
            failure = f"the {group} child did not end within its budget and was killed"
        if failure:
            record_lost(args.out, group, only, failure)
    summary = summarize(args.out)
    (args.out / "summary.txt").write_text(summary + "\n")
    print("\n" + summary)


if __name__ == "__main__":
    main()
