"""What a bug report says in plain words: each diagnosis explained, the library a backend calls, a case's features
and shape, and the sentences that sum up a cross-check (attnfuzz.tools.bugreport writes them into its report)."""

from __future__ import annotations

import math

from attnfuzz.store import corpus as corpus_io
from attnfuzz.tools.crosscheck import Row, saved_label
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

# What each diagnosis means, in a maintainer's words: (a phrase for the title, the explanation).
EXPLAIN = {
    V.SHAPE: ("returns a tensor in the wrong shape", "a returned tensor (the output, the LSE or a gradient) has "
              "another shape than the contract's, its axes likely in another order (e.g. [b, h, sq, d] for "
              "[b, sq, h, d]); no value was compared"),
    V.ALL_ZERO: ("returns an all-zero output", "every graded output element is 0 where the exact answer is not"),
    V.NONFINITE: ("returns NaN or inf", "the output holds NaN or inf where the exact answer is finite"),
    V.EMPTY_ROWS: ("gets rows that see no key wrong", "only query rows with no visible key are wrong: softmax over "
                   "no key must give 0 there, and every other row is right"),
    V.MASK_ALIGNMENT: ("puts the mask's diagonal at the wrong alignment", "the output matches the other alignment of "
                       "the causal / window diagonal (top-left vs bottom-right) within the bound"),
    V.MASK_IGNORED: ("ignores the mask", "the output matches attention with no causal mask or window at all: the "
                     "band was never applied"),
    V.WINDOW_OFF_BY_ONE: ("has its window off by one", "the output matches a window with one bound moved by one"),
    V.GQA_MAPPING: ("maps query heads to the wrong KV heads", "the output matches query head i reading KV head i % hk "
                    "instead of i // (h // hk)"),
    V.SCALE: ("uses the wrong softmax scale", "the output matches another softmax scale"),
    V.LSE: ("returns a wrong log-sum-exp", "the output is right; the log-sum-exp returned beside it is not"),
    V.GRADIENT: ("returns wrong gradients", "the forward output is right; a gradient (dQ, dK or dV) is not"),
    V.TOLERANCE: ("is wrong beyond rounding error", "the error exceeds what a correct kernel's rounding allows, and no "
                  "simple mistake (other alignment, window off by one, dropped mask, head mapping, scale) explains it"),
    V.NONDETERMINISTIC: ("is not bitwise reproducible", "two identical runs on the same inputs differ in some bits"),
    V.BATCH_VARIANT: ("is not batch invariant", "a sequence gets other bits alone (or in another batch order) than "
                      "inside its batch, though the backend claims it does not"),
}
LIBRARIES = {"flex-eager": ("torch", "torch flex_attention, eager"), "fa2": ("flash-attn 2", "flash-attn 2"),
             "flex-compiled": ("torch", "torch.compile(flex_attention)"), "fa3": ("flash-attn 3", "flash-attn 3"),
             "fa3-fp8": ("flash-attn 3", "flash-attn 3's FP8 forward"),
             "fa4": ("flash-attn-4", "flash-attn-4 (flash_attn.cute)")}
TE_ONLY = {"te-flash": "FlashAttention", "te-fused": "FusedAttention (cuDNN)",
           "te-unfused": "UnfusedDotProductAttention",
           "te-fused-fp8": "FusedAttention (cuDNN FP8 attention, DelayedScaling, Float8Tensor inputs)"}


def library(name: str) -> tuple[str, str]:
    """(the library a backend needs, what the backend calls in it); ("", "") for a bring-your-own kernel."""
    if name.startswith("sdpa-"):
        return "torch", f"torch SDPA forced to its {name[5:]} kernel"
    if name in TE_ONLY:
        return "TransformerEngine", f"TransformerEngine DotProductAttention with only {TE_ONLY[name]} enabled"
    if name.startswith("te-cp-"):
        comm, _, kernel = name[6:].rpartition("-")
        return "TransformerEngine", f"TransformerEngine context parallelism, cp_comm_type {comm}, {kernel} attention"
    if name.startswith("ring-"):
        return "torch", f"torch context-parallel ring attention, {name[5:]} rotation"
    return LIBRARIES.get(name, ("", ""))


def what_went_wrong(verdict: V.Verdict) -> tuple[str, str]:
    """(a phrase for the title, the explanation) of a failure's label."""
    d = verdict.diagnosis or ""
    if verdict.status == V.FLAKY:
        status, _, inner = d.partition(":")
        phrase, why = what_went_wrong(V.Verdict(status, inner or None))
        return f"sometimes {phrase}", f"{why}; not every time: rerun on the same inputs, the case did not always fail"
    if verdict.status == V.FAIL and d in EXPLAIN:
        return EXPLAIN[d]
    if verdict.status == V.HANG:
        return "hangs", "no answer came back within the time limit, twice (the second time with twice the limit)"
    if verdict.status != V.CRASH:
        return verdict.label.lower(), verdict.message
    if d == V.CUDA_ILLEGAL_ADDRESS:
        return "hits an illegal memory access", ("the call raised CUDA error 700 (illegal address), which poisons the "
                                                 "CUDA context of the process that saw it")
    how = f" with {d}" if d.startswith("SIG") else f" with exit status {d[5:]}" if d.startswith("EXIT_") else ""
    if how or d == "PROCESS_DIED":
        return f"kills its process{how}", f"the process running the call died{how}"
    return f"raises {d}", f"the call raised {d} on a case the adapter lists as supported"


def features(case: Case) -> tuple[str, list[str]]:
    """(what attention it is, its other salient features), in plain words."""
    align = case.alignment.replace("_", "-")
    if case.mask_density is not None:
        kind = f"attention with an explicit boolean mask (keeping {case.mask_density:g} of keys)"
    elif case.right == 0 and case.left is None:
        kind = f"causal ({align}) attention"
    elif case.window != (None, None):
        kind = f"sliding-window attention (left {case.left}, right {case.right}, {align})"
    else:
        kind = "unmasked attention"
    rest = [f"padded sequences (query lengths {list(case.lens_q)}, key lengths {list(case.lens_kv)})"] * case.padded
    rest += {"thd": ["the packed thd layout"], "sbhd": ["the sequence-major sbhd layout"]}.get(case.layout, [])
    rest += {"transposed": ["head-major (transposed) q/k/v buffers"],
             "expanded_kv": ["stride-0 K/V (one KV head expanded)"]}.get(case.memory, [])
    rest += [f"GQA ({case.h} query heads over {case.hk} KV head{'s' * (case.hk > 1)})"] * (case.h != case.hk)
    rest += [f"d_qk {case.d_qk} != d_v {case.d_v}"] * (case.d_qk != case.d_v)
    rest += [f"softcap {case.softcap:g}"] if case.softcap is not None else []
    rest += ["ALiBi"] * (case.alibi_slopes is not None)
    rest += [f"{'an off-by-one' if case.softmax == 'off_by_one' else 'a learnable'} softmax sink"] * (
        case.softmax != "vanilla")
    rest += [f"scale {case.scale:g}"] if case.scale is not None else []
    rest += [f"inputs of mean {list(case.mean)} and std {list(case.std)} (large logits)"] * (
        case.mean != (0.0, 0.0, 0.0) or case.std != (1.0, 1.0, 1.0))
    return kind, rest + ["gradients"] * case.grads


def shape(case: Case) -> str:
    heads = f"h={case.h}" if case.h == case.hk else f"h={case.h} hk={case.hk}"
    dims = f"d={case.d_qk}" if case.d_qk == case.d_v else f"d_qk={case.d_qk} d_v={case.d_v}"
    lens = f"sq=skv={case.sq}" if case.sq == case.skv else f"sq={case.sq} skv={case.skv}"
    return f"{case.dtype}, b={case.b} {lens} {heads} {dims}"


def num(x: float) -> str:
    return "inf" if x == math.inf else ("nan" if x != x else f"{x:.4g}")


def joined(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def now_sentence(entry: corpus_io.Entry, own: Row, device: str) -> str:
    """Whether the entry's failure came back here, in its own spelling."""
    saved, v = entry.verdict, own.verdict
    if v is None:
        return (f"{entry.backend} cannot run on this machine ({own.detail.rstrip('.')}), so the failure is not "
                f"confirmed here: the worst element below is the one recorded when it was found.")
    name = f"{entry.backend} {own.version}".strip()
    on = f" on {device} (it was found on {entry.device}: another kernel)" \
        if device.split(":")[0] != entry.device.split(":")[0] else ""
    if v.status == V.UNSUPPORTED:
        return f"Here{on} {name} refuses the case ({v.message}), so the failure is not confirmed here."
    if v.failed and v.label == saved_label(saved):
        return (f"Here{on}, {name} fails the case the same way ({v.label})." if on
                else f"It reproduces here: {name} fails the case again with {v.label}.")
    if v.failed:
        return f"It still fails here{on}, but now as {v.label} (recorded as {saved.label})."
    if saved.status == V.FLAKY:
        return (f"It did not fail in this one run here{on} ({name} passed); the entry is flaky, so a pass is no "
                f"evidence that it is fixed.")
    return (f"It no longer reproduces here{on}: {name} passes the case (error / bound {num(v.ratio)}); compare the "
            f"environment it was found in, below.")


def others_sentence(entry: corpus_io.Entry, rows: list[Row]) -> str:
    ran = [r for r in rows if r.verdict is not None and r.verdict.status != V.UNSUPPORTED]
    label = saved_label(entry.verdict)
    passed = list(dict.fromkeys(r.backend for r in ran if not r.own and r.verdict.status == V.PASS))
    same = list(dict.fromkeys(r.backend for r in ran if not r.own and r.verdict.label == label))
    other = list(dict.fromkeys(f"{r.backend} ({r.verdict.label}{', ' + r.note if r.note else ''})" for r in ran
                               if not r.own and r.verdict.failed and r.verdict.label != label))
    refused = list(dict.fromkeys(r.backend for r in rows if not r.own and r.outcome == V.UNSUPPORTED))
    if passed:
        parts = [f"On the same case here, {joined(passed)} {'pass' if len(passed) > 1 else 'passes'} against the "
                 f"float64 oracle."]
    elif refused and not any(not r.own for r in ran):
        parts = [f"No other backend that can run here takes the case: {joined(refused)} refuse"
                 f"{'s' * (len(refused) == 1)} it (the table says why)."]
    else:
        parts = ["No other backend passes the case here."]
    parts += [f"{joined(same)} {'fail' if len(same) > 1 else 'fails'} the same way ({label})."] if same else []
    parts += [f"Failing differently: {joined(other)}."] if other else []
    mine_pass = [r.spelling for r in ran if r.own and r.verdict.status == V.PASS]
    mine_fail = [r.spelling for r in ran if r.own and r.verdict.failed]
    if mine_pass and mine_fail:
        parts.append(f"Of {entry.backend}'s spellings, {joined(mine_fail)} fail{'s' * (len(mine_fail) == 1)} and "
                     f"{joined(mine_pass)} pass{'es' * (len(mine_pass) == 1)}.")
    return " ".join(parts)
