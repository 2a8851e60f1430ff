"""Where a case's inputs are drawn: large cases bound for a GPU on the device itself (strategies/materialize.py's
draw_device), everything else on the CPU, so that every device sees the same values. Checked on the CPU: the policy,
that draw() creates every tensor on the device it is given, and that the oracle of a device-drawn case stays there."""

from __future__ import annotations

import itertools

import torch
from torch.overrides import TorchFunctionMode

from attnfuzz.engine.harness import oracle_inputs
from attnfuzz.strategies.case import FAMILIES, Case
from attnfuzz.strategies.materialize import (DEVICE_DRAW_FROM, Tensors, draw, draw_device, draw_on_cpu,
                                             input_elements, materialize)

SMALL = Case(b=2, sq=9, skv=13, h=4, hk=2, d_qk=16, d_v=8, dtype="bfloat16")
DECODE = Case(b=1, sq=4, skv=65536, h=8, hk=2, d_qk=128, d_v=128, dtype="bfloat16")


def test_large_cases_bound_for_a_gpu_are_drawn_there():
    assert input_elements(SMALL) < DEVICE_DRAW_FROM <= input_elements(DECODE)
    assert draw_device(DECODE, "cuda:1") == torch.device("cuda:1")
    assert draw_device(SMALL, "cuda") == torch.device("cpu")        # the same values on every device
    assert draw_device(DECODE, "cpu") == torch.device("cpu")
    grads = DECODE.replace(sq=2048, skv=64, grads=True)               # dout counts
    assert input_elements(grads) == 2048 * 8 * 128 * 2 + 64 * 2 * 256


class _Factories(TorchFunctionMode):
    """Records every tensor factory called without a device (it would make its tensor on the CPU)."""

    FACTORIES = {torch.randn, torch.rand, torch.randint, torch.zeros, torch.tensor, torch.arange, torch.full,
                 torch.empty, torch.ones}

    def __init__(self):
        super().__init__()
        self.undirected: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.FACTORIES and "device" not in kwargs:
            self.undirected.append(func.__name__)
        return func(*args, **kwargs)


def _cases():
    for seed, (values, softmax, memory, grads, density) in enumerate(itertools.product(
            ("gaussian", "probe", *FAMILIES), ("vanilla", "learnable", "off_by_one"),
            ("contiguous", "transposed", "expanded_kv"), (False, True), (None, 0.5))):
        if values == "large_sink" and softmax != "learnable":
            continue
        yield SMALL.replace(values=values, softmax=softmax, memory=memory, grads=grads, mask_density=density,
                            alibi_slopes=(0.5, 0.25, 0.1, 0.05), seqlens_q=(9, 4), seqlens_kv=(13, 0),
                            seed=seed * 7919)


def test_draw_makes_every_tensor_on_the_device_it_is_given():
    # on a GPU the same code runs with device="cuda": a factory without a device would draw on the CPU and copy
    for case in _cases():
        with _Factories() as seen:
            drawn = draw(case, "cpu")
        assert not seen.undirected, (case, seen.undirected)
        assert all(t is None or t.device.type == "cpu" for t in vars(drawn).values())


def test_the_device_draw_keeps_the_cpu_values_on_the_cpu():
    # draw_on_cpu, what every device gets for a small case, is draw on the CPU: the same stream as ever
    for case in _cases():
        a, b = draw(case, "cpu"), materialize(case)
        for name, x in vars(draw_on_cpu(case)).items():
            for other in (getattr(a, name), getattr(b, name)):
                assert (x is None) == (other is None)
                assert x is None or (torch.equal(x.view(torch.int16) if x.dtype == torch.bfloat16 else x,
                                                 other.view(torch.int16) if x.dtype == torch.bfloat16 else other)
                                     and x.stride() == other.stride()), (case, name)


def test_the_oracle_of_a_case_drawn_on_the_device_runs_there():
    def on(device):
        return Tensors(*(torch.empty(1, device=device) for _ in range(3)), None, None, None, None)

    small_decode = Case(b=1, sq=1, skv=8192, h=1, hk=1, d_qk=256, d_v=256, dtype="float16")  # 8192 scores
    assert draw_device(small_decode, "cuda") == torch.device("cuda")
    device_drawn = on("meta")  # a tensor off the CPU, as the device's draw gives
    assert oracle_inputs(small_decode, device_drawn, device_drawn, "cuda") == (device_drawn, "cuda")
    cpu_drawn, moved = on("cpu"), on("meta")
    assert oracle_inputs(SMALL, cpu_drawn, moved, "cuda") == (cpu_drawn, "cpu")   # small: the CPU draw
