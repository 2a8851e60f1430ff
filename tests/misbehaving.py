"""Bring-your-own kernels that misbehave for real: the crash-isolation tests run them in worker processes."""

import ctypes
import os
import time

import torch


def _plain(q, k, v, scale):
    """Unmasked attention, right for cases without a mask (the only ones these tests give it)."""
    k, v = (x.repeat_interleave(q.shape[2] // x.shape[2], dim=2) for x in (k, v))
    weights = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", weights, v.float()).to(q.dtype)


def segfault_when_causal(q, k, v, *, causal, window, bottom_right, scale):
    if causal:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return _plain(q, k, v, scale)


def aborts(q, k, v, *, causal, window, bottom_right, scale):
    os.abort()


def hangs(q, k, v, *, causal, window, bottom_right, scale):
    time.sleep(3600)


def raises(q, k, v, *, causal, window, bottom_right, scale):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


segfault_when_causal.supports = lambda case: case.window == (None, None) or "a plain kernel: no windows"


def zero_when_causal(q, k, v, *, causal, window, bottom_right, scale):
    """A silent wrong answer (seed 001's all-zero causal output), for campaigns that must find and keep it."""
    out = _plain(q, k, v, scale)
    return out * 0 if causal else out


zero_when_causal.supports = segfault_when_causal.supports


def nan_when_long(q, k, v, *, causal, window, bottom_right, scale):
    """NaN in every row once a sequence is longer than 4 queries: a second, independent silent bug."""
    out = _plain(q, k, v, scale)
    return out * float("nan") if q.shape[1] > 4 else out


nan_when_long.supports = segfault_when_causal.supports
