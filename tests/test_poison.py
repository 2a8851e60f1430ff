"""Memory poisoning: the allocation plan on a synthetic allocator snapshot, the switch reaching every process that
runs a backend, and (on a GPU) a kernel that leaves rows unwritten caught every time."""

from __future__ import annotations

import pytest
import torch

from attnfuzz.engine import poison
from attnfuzz.backends import get
from attnfuzz.cli import main
from attnfuzz.engine.harness import run_case
from attnfuzz.strategies.case import Case

MiB = 1 << 20


def _segment(kind, blocks, device=0, stream=0, pool=(0, 0)):
    return {"device": device, "stream": stream, "segment_type": kind, "segment_pool_id": pool,
            "total_size": sum(size for size, _ in blocks),
            "blocks": [{"size": size, "state": state} for size, state in blocks]}


def test_the_plan_takes_every_free_block_from_its_own_pool_and_nothing_held():
    snapshot = [
        _segment("large", [(20 * MiB, "inactive"), (30 * MiB, "active_allocated"), (70 * MiB, "inactive")]),
        _segment("small", [(512, "active_allocated"), (2 * MiB - 512, "inactive")]),
        _segment("small", [(1024, "inactive"), (2 * MiB - 1024, "active_allocated")]),
        _segment("large", [(40 * MiB, "inactive")], device=1),          # another GPU
        _segment("large", [(40 * MiB, "inactive")], stream=7),          # another stream's pool
        _segment("large", [(40 * MiB, "inactive")], pool=(1, 0)),       # a CUDA graph's private pool
    ]
    sizes = poison.plan(snapshot, device_index=0, stream=0)
    free_small = (2 * MiB - 512) + 1024
    topped_up = [poison.PIECE["small"]] * -(-(poison.RESERVE["small"] - free_small) // poison.PIECE["small"])
    assert sizes == ([70 * MiB, 20 * MiB]                   # large blocks whole, largest first (90 MiB: no top-up)
                     + [MiB, MiB - 512, 1024]               # small ones in pieces of <= 1 MiB, kept in the small pool
                     + topped_up)                           # the small pool topped up to its reserve


def test_the_reserve_is_topped_up_once_and_never_grows():
    first = poison.plan([], device_index=0, stream=0)
    assert sum(s for s in first if s > poison.SMALL_LIMIT) == poison.RESERVE["large"]
    assert sum(s for s in first if s <= poison.SMALL_LIMIT) == poison.RESERVE["small"]
    # the reserve freed into the cache: the next plan takes exactly those blocks again, asking for no new memory
    cached = [_segment("large", [(s, "inactive") for s in first if s > poison.SMALL_LIMIT]),
              _segment("small", [(2 * MiB, "inactive")] * (poison.RESERVE["small"] // (2 * MiB)))]
    again = poison.plan(cached, device_index=0, stream=0)
    assert sum(again) == sum(first)


def test_poisoning_runs_right_before_the_backend(monkeypatch):
    calls = []
    backend = get("sdpa-math", "cpu")
    monkeypatch.setattr(poison, "poison", lambda device: calls.append(("poison", str(device))))
    real_run = backend.run
    monkeypatch.setattr(backend, "run", lambda case, t: calls.append(("run",)) or real_run(case, t))
    case = Case(sq=3, skv=3, d_qk=8, d_v=8)
    monkeypatch.delenv(poison.ENV, raising=False)
    assert run_case(backend, case).status == "PASS" and ("poison", "cpu") not in calls
    monkeypatch.setenv(poison.ENV, "1")
    calls.clear()
    assert run_case(backend, case).status == "PASS" and calls[:2] == [("poison", "cpu"), ("run",)]


@pytest.mark.parametrize("flag", [False, True])
def test_the_switch_reaches_isolated_workers(tmp_path, monkeypatch, flag):
    """`attnfuzz run --poison-memory --isolate`: the worker process has it on (its kernel returns zeros only then),
    also when a fork server started earlier without it is reused."""
    monkeypatch.delenv(poison.ENV, raising=False)
    args = ["run", "--backend", "tests.misbehaving:zero_when_poisoned", "--isolate", "--max-examples", "5",
            "--corpus", str(tmp_path / "corpus")] + (["--poison-memory"] if flag else [])
    assert main(args) == (1 if flag else 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the CPU allocator keeps no cache to poison")
@pytest.mark.parametrize("seqlens_kv", [(2, 0), (0, 3)])
def test_unwritten_rows_read_nan_every_time_on_the_gpu(monkeypatch, seqlens_kv):
    monkeypatch.setenv(poison.ENV, "1")
    broken = get("tests.misbehaving:skips_empty_sequences", "cuda")
    case = Case(b=2, sq=3, skv=3, d_qk=8, d_v=8, dtype="float16", seqlens_kv=seqlens_kv)
    labels = [run_case(broken, case.replace(seed=seed), device="cuda").label for seed in range(5)]
    assert labels == ["FAIL:NONFINITE"] * 5
    # control: poisoning does not touch what a correct kernel writes (its inputs and outputs are live memory)
    correct = get("sdpa-math", "cuda")
    assert all(run_case(correct, case.replace(seed=seed), device="cuda").status == "PASS" for seed in range(5))
