"""Deliberately broken backends: the negative controls every detector must fire on.

Each one is torch SDPA (math) fed a correct mask, with exactly one planted bug. `Correct()` is the same backend
without a bug, the control that must never fail.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnfuzz.backends.base import Backend, first_reason
from attnfuzz.backends.layout import visibility_mask
from attnfuzz.oracles.verdict import Output


class Correct(Backend):
    """SDPA math with an explicit mask: expresses bshd, vanilla softmax, no softcap, no ALiBi."""

    name = "correct"

    def unsupported(self, case):
        return first_reason((case.layout != "bshd", "bshd only"), (case.softmax != "vanilla", "vanilla only"),
                            (case.softcap is not None, "no softcap"), (case.alibi_slopes is not None, "no ALiBi"),
                            (case.grads, "no gradients"))

    def attend(self, case, t, *, mask=None, scale=None, kv_heads=None):
        q, k, v = (x.transpose(1, 2) for x in (t.q, t.k, t.v))
        if kv_heads is not None:
            k, v = k[:, kv_heads], v[:, kv_heads]
        mask = visibility_mask(case, t, t.q.device) if mask is None else mask
        with sdpa_kernel([SDPBackend.MATH]):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale or case.softmax_scale,
                                                 enable_gqa=kv_heads is None)
        return out.transpose(1, 2)

    def run(self, case, t):
        return Output(self.attend(case, t), ran="sdpa-math")


class ZeroWhenCausal(Correct):
    name = "broken-zero-causal"

    def run(self, case, t):
        out = self.attend(case, t)
        return Output(torch.zeros_like(out) if case.causal else out)


class SwappedAlignment(Correct):
    name = "broken-alignment"

    def run(self, case, t):
        other = "top_left" if case.alignment == "bottom_right" else "bottom_right"
        return Output(self.attend(case, t, mask=visibility_mask(case.replace(alignment=other), t, t.q.device)))


class WindowOffByOne(Correct):
    name = "broken-window"

    def run(self, case, t):
        if case.left is None:
            return Output(self.attend(case, t))
        wider = case.replace(window=(case.left + 1, case.window[1]))
        return Output(self.attend(case, t, mask=visibility_mask(wider, t, t.q.device)))


class ModuloHeads(Correct):
    name = "broken-gqa"

    def run(self, case, t):
        return Output(self.attend(case, t, kv_heads=torch.arange(case.h) % case.hk))


class ValueDimScale(Correct):
    name = "broken-scale"

    def run(self, case, t):
        return Output(self.attend(case, t, scale=case.scale or 1 / math.sqrt(case.d_v)))


class NanOnEmptyRows(Correct):
    name = "broken-nan-rows"

    def run(self, case, t):
        out = self.attend(case, t)
        empty = ~visibility_mask(case, t, t.q.device).any(-1)          # [b, 1, sq]
        return Output(out.masked_fill(empty.transpose(1, 2)[..., None], float("nan")))


class TileTail(Correct):
    """Corrupts the accumulator when skv % 64 == 1 (a lone key in the tail tile): a tail-tile bug."""

    name = "broken-tile-tail"

    def run(self, case, t):
        out = self.attend(case, t)
        return Output(out + 1 if case.skv % 64 == 1 and case.skv > 64 else out)


class DroppedBandWhenLonger(Correct):
    """Ignores the causal mask / window when sq > skv, as SDPA's efficient kernel did on the H200 for a bottom-right
    causal bias (a negative diagonal offset that masks nothing)."""

    name = "broken-mask-dropped"

    def run(self, case, t):
        if case.sq > case.skv:
            return Output(self.attend(case, t, mask=visibility_mask(case.replace(causal=False, window=(None, None)),
                                                                    t, t.q.device)))
        return Output(self.attend(case, t))


class DroppedCausal(Correct):
    """Drops the causal mask: a causal case attends to every key (its window with it). One bug, which the grader
    names MASK_IGNORED, but WINDOW_OFF_BY_ONE on sq = skv = 2 (the right bound moved by one hides every key too) and
    MASK_ALIGNMENT on sq = 1, skv = 2 (bottom-right alignment sees every key there)."""

    name = "broken-causal-dropped"

    def run(self, case, t):
        if case.causal:
            case = case.replace(causal=False, window=(None, None))
        return Output(self.attend(case, t, mask=visibility_mask(case, t, t.q.device)))


class DroppedCausalWhenSquareAndScale(Correct):
    """Two independent bugs: the causal mask dropped when sq == skv, and the softmax scaled by 1/sqrt(d_v)."""

    name = "broken-causal-square-and-scale"

    def run(self, case, t):
        scale = case.scale or 1 / math.sqrt(case.d_v)
        if case.causal and case.sq == case.skv:
            case = case.replace(causal=False, window=(None, None))
        return Output(self.attend(case, t, mask=visibility_mask(case, t, t.q.device), scale=scale))


class WindowOffByOneAndDroppedWhenLonger(Correct):
    """Two independent bugs whose smallest cases both read as a band gone: the left window bound widened by one, and
    the whole band dropped when sq > skv."""

    name = "broken-window-and-mask-dropped"

    def run(self, case, t):
        if case.sq > case.skv:
            case = case.replace(causal=False, window=(None, None))
        elif case.left is not None:
            case = case.replace(window=(case.left + 1, case.window[1]))
        return Output(self.attend(case, t, mask=visibility_mask(case, t, t.q.device)))


class HeadMajor(Correct):
    """Returns its output head-major, [b, h, sq, d_v], where the contract is [b, sq, h, d_v]: the right values, in
    the wrong shape."""

    name = "broken-head-major"

    def run(self, case, t):
        return Output(self.attend(case, t).transpose(1, 2))


class LaterBatches(Correct):
    name = "broken-batch"

    def run(self, case, t):
        out = self.attend(case, t).clone()
        out[1:] = out[1:] * 0.5
        return Output(out)


class Jittery(Correct):
    """Claims determinism, but every other run nudges one element by one unit in the last place: inside every
    tolerance, caught only by the bitwise rerun."""

    name = "broken-jitter"
    deterministic = True
    calls = 0

    def run(self, case, t):
        self.calls += 1
        out = self.attend(case, t).clone()
        if self.calls % 2 == 0:
            out.view(-1)[0] = torch.nextafter(out.view(-1)[0], torch.tensor(math.inf, dtype=out.dtype))
        return Output(out)


class Intermittent(Correct):
    """All zeros under causal on every third run only: a race, as the confirming reruns see it."""

    name = "broken-intermittent"
    calls = 0

    def run(self, case, t):
        out = self.attend(case, t)
        if case.causal:
            self.calls += 1
            if self.calls % 3 == 1:
                return Output(torch.zeros_like(out))
        return Output(out)


BROKEN = {cls.name: cls for cls in (Correct, ZeroWhenCausal, SwappedAlignment, WindowOffByOne, ModuloHeads,
                                   ValueDimScale, NanOnEmptyRows, TileTail, DroppedBandWhenLonger, LaterBatches,
                                   Jittery, Intermittent, DroppedCausal, DroppedCausalWhenSquareAndScale,
                                   WindowOffByOneAndDroppedWhenLonger, HeadMajor)}


class LeaksOneKey(Correct):
    """The last query row of each sequence counts one key it must not see: the first hidden key past its last
    visible one, else the last before its first (a band edge, or a hole of the explicit mask). One bug with several
    names: MASK_LEAK on probe values, TOLERANCE on Gaussian ones."""

    name = "broken-leak-key"

    def run(self, case, t):
        mask = visibility_mask(case, t, t.q.device).clone()
        for b, (nq, nk) in enumerate(zip(case.lens_q, case.lens_kv)):
            for h in range(mask.shape[1] if nq else 0):
                seen = mask[b, h, nq - 1, :nk]
                hidden = (~seen).nonzero().flatten()
                if bool(seen.any()) and hidden.numel():
                    after = hidden[hidden > seen.nonzero().flatten()[-1]]
                    mask[b, h, nq - 1, after[0] if after.numel() else hidden[-1]] = True
        return Output(self.attend(case, t, mask=mask))


def _without_last_key(case, t):
    """The case's visibility with key skv - 1 hidden from every query (a kernel that loses a tile's last key)."""
    mask = visibility_mask(case, t, t.q.device).clone()
    mask[..., -1] = False
    return mask


class TruncatedHeadDim(Correct):
    """Reads only the first 128 channels of q and k when d_qk > 128 (a kernel whose tile stops at 128)."""

    name = "broken-head-dim-128"

    def run(self, case, t):
        if case.d_qk <= 128:
            return Output(self.attend(case, t))
        cut = dataclasses.replace(t, q=t.q[..., :128], k=t.k[..., :128])
        return Output(self.attend(case, cut, scale=case.softmax_scale))


class DropsKeyPast1024(Correct):
    """Loses the last key when skv > 1024 (a split-KV pass that drops its last block's final key)."""

    name = "broken-long-row"

    def run(self, case, t):
        return Output(self.attend(case, t, mask=_without_last_key(case, t) if case.skv > 1024 else None))


class DropsKeyAtResidue64(Correct):
    """Loses the last key when skv % 128 == 64 (a half-full last tile whose bound is off by one)."""

    name = "broken-tile-residue"

    def run(self, case, t):
        return Output(self.attend(case, t, mask=_without_last_key(case, t) if case.skv % 128 == 64 else None))


class DecodeDropsLastBlock(Correct):
    """Loses the last 64 keys on decode shapes, at most 16 queries over 512 or more keys (a split-KV decode pass that
    never merges its last split). One key among 512 random ones moves a row by less than its bound (docs/grading.md):
    a block is what such a bug loses."""

    name = "broken-decode"

    def run(self, case, t):
        if not (case.sq <= 16 and case.skv >= 512):
            return Output(self.attend(case, t))
        mask = visibility_mask(case, t, t.q.device).clone()
        mask[..., -64:] = False
        return Output(self.attend(case, t, mask=mask))
