"""Planted kernels for the EMPTY_ROWS rule: wrong on the rows that see no key, and on other rows or not."""

from __future__ import annotations

import math

import torch

from attnfuzz.backends.layout import visibility_mask
from attnfuzz.oracles.verdict import Output
from tests.broken import Correct


def _empty(case, t) -> torch.Tensor:
    """[b, sq, 1, 1] True on a valid query row that sees no key."""
    return (~visibility_mask(case, t, t.q.device).any(-1)).transpose(1, 2)[..., None]


class MeanOnEmptyRowsAndScale(Correct):
    """Two bugs: a row with no visible key gets mean(V) (uniform weights over masked keys), and the softmax is
    scaled by 1/sqrt(d_v) on every row."""

    name = "broken-mean-rows-and-scale"

    def run(self, case, t):
        out = self.attend(case, t, scale=case.scale or 1 / math.sqrt(case.d_v))
        mean = t.v.mean(1, keepdim=True).repeat_interleave(case.h // case.hk, dim=2)   # [b, 1, h, d_v]
        return Output(torch.where(_empty(case, t), mean.expand_as(out), out))


class NanOnEmptyRowsAndNanElsewhere(Correct):
    """NaN on the rows with no visible key, and on the last row of every sequence, which sees keys."""

    name = "broken-nan-rows-and-last"

    def run(self, case, t):
        out = self.attend(case, t).masked_fill(_empty(case, t), float("nan"))
        out[:, -1] = float("nan")
        return Output(out)
