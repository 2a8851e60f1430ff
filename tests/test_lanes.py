"""Lanes per GPU by default (fuzz/campaign/lanes.py), each lane's share of its GPU (attnfuzz.engine.memshare), and
what a lane is handed: no GPU is needed, the machine's figures are given."""

from __future__ import annotations

import argparse

import pytest
import torch

from attnfuzz.backends import get
from attnfuzz.campaign import lanes, supervisor
from attnfuzz.engine import harness, memshare
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

GiB = 2**30
H200 = dict(cores=16, gpus=1, gpu_bytes=140 * GiB, host_bytes=128 * GiB)


def test_an_h200_host_runs_a_lane_per_core_but_one():
    sizing = lanes.size(**H200)
    assert (sizing.per_gpu, sizing.by_cores) == (15, 15)
    assert sizing.by_gpu_memory > 15 and sizing.by_host_memory > 15
    assert 15 * (sizing.share_bytes + lanes.CONTEXT_BYTES) <= 140 * GiB * lanes.GPU_USABLE + 1
    assert sizing.share_bytes >= lanes.MIN_SHARE_BYTES


@pytest.mark.parametrize("change, bound", [
    (dict(cores=3), "by_cores"),                  # two lanes: one core is the campaign's
    (dict(gpu_bytes=16 * GiB), "by_gpu_memory"),   # a small GPU: shares of at least MIN_SHARE_BYTES
    (dict(host_bytes=16 * GiB), "by_host_memory"),
    (dict(gpus=8), "by_cores"),                   # eight GPUs share the host's cores
])
def test_each_bound_can_be_the_one_that_holds(change, bound):
    sizing = lanes.size(**{**H200, **change})
    assert sizing.per_gpu == getattr(sizing, bound) < 15
    assert sizing.per_gpu == min(sizing.by_cores, sizing.by_gpu_memory, sizing.by_host_memory)


def test_workers_override_the_count_and_the_share_follows():
    four, one = lanes.size(**H200, per_gpu=4), lanes.size(**H200, per_gpu=1)
    assert (four.per_gpu, one.per_gpu) == (4, 1)
    assert four.share_bytes > lanes.size(**H200).share_bytes and one.share_bytes > four.share_bytes


def _config(tmp_path, monkeypatch, *extra):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(supervisor, "_gpu_count", lambda: 1)
    monkeypatch.setattr(lanes, "host_cores", lambda: 16)
    monkeypatch.setattr(lanes, "gpu_memory_bytes", lambda: 140 * GiB)
    monkeypatch.setattr(lanes, "host_memory_bytes", lambda: 128 * GiB)
    parser = argparse.ArgumentParser()
    supervisor.add_parser(parser.add_subparsers())
    args = parser.parse_args(["campaign", "--backends", "tests.misbehaving:drops_causal", "--device", "cuda",
                              "--dir", str(tmp_path / "camp"), *extra])
    return supervisor.new_config(args)


def test_a_cuda_campaign_sizes_its_lanes_and_shares_the_gpu(tmp_path, monkeypatch):
    config = _config(tmp_path, monkeypatch)
    assert config["lanes"] == 15 and config["gpu_share"] == lanes.size(**H200).share_bytes
    assert "15 lane(s) per GPU" in config["sizing"]
    one = _config(tmp_path, monkeypatch, "--workers", "1")   # a GPU of its own: no share, an OOM stays a crash
    assert one["lanes"] == 1 and one["gpu_share"] is None


def test_a_lane_is_handed_its_share_and_the_shared_compile_caches(tmp_path, monkeypatch):
    handed = {}

    class Popen:
        def __init__(self, cmd, env, **kwargs):
            handed.update(env)

    (tmp_path / "state").mkdir()
    monkeypatch.setattr(supervisor.subprocess, "Popen", Popen)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    supervisor.start_lane(tmp_path, 3, {"device": "cuda", "lanes": 15, "gpus": 1, "gpu_share": 7 * GiB})
    assert handed[memshare.ENV] == str(7 * GiB) and handed["CUDA_VISIBLE_DEVICES"] == "0"
    assert handed["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    assert handed["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    handed.clear()
    supervisor.start_lane(tmp_path, 0, {"device": "cuda", "lanes": 1, "gpus": 1, "gpu_share": None})
    assert memshare.ENV not in handed


CASE = Case(b=1, sq=4, skv=4, h=1, hk=1, d_qk=8, d_v=8, dtype="float32", layout="bshd")


def _out_of_memory(q, k, v, *, causal, window, bottom_right, scale):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def test_out_of_memory_under_a_share_is_a_refusal_and_without_one_a_crash(monkeypatch):
    import sys
    monkeypatch.setattr(sys.modules[__name__], "_out_of_memory", _out_of_memory, raising=False)
    backend = get(f"{__name__}:_out_of_memory", "cpu")
    monkeypatch.delenv(memshare.ENV, raising=False)
    assert harness.run_case(backend, CASE).status == V.CRASH
    monkeypatch.setenv(memshare.ENV, str(7 * GiB))
    shared = harness.run_case(backend, CASE)
    assert shared.status == V.UNSUPPORTED and "share of 7.0 GiB" in shared.message


def test_other_crashes_stay_crashes_under_a_share(monkeypatch):
    monkeypatch.setenv(memshare.ENV, str(7 * GiB))
    assert memshare.refusal(RuntimeError("an illegal memory access was encountered")) is None
    assert memshare.refusal(torch.OutOfMemoryError("CUDA out of memory.")) is not None


def test_a_malformed_share_names_the_variable(monkeypatch):
    monkeypatch.setenv(memshare.ENV, "lots")
    with pytest.raises(ValueError, match=memshare.ENV):
        memshare.share_bytes()


def test_a_lanes_cases_keep_to_its_share(tmp_path, monkeypatch):
    import json
    from attnfuzz.campaign.lane import Lane
    (tmp_path / "campaign.json").write_text(json.dumps({"device": "cuda", "hours": 1.0, "max_len": None}))
    monkeypatch.setenv(memshare.ENV, str(7 * GiB))
    assert Lane(tmp_path, 0).space().max_bytes == 7 * GiB
    monkeypatch.delenv(memshare.ENV)
    assert Lane(tmp_path, 0).space().max_bytes is None


def test_a_share_caps_the_allocator_of_the_lanes_gpu(monkeypatch):
    capped = []

    class Properties:
        total_memory = 140 * GiB

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Properties())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, index: capped.append((f, index)))
    monkeypatch.setenv(memshare.ENV, str(7 * GiB))
    memshare.apply("cuda")
    memshare.apply("cuda:1")
    memshare.apply("cpu")
    assert capped == [(0.05, 0), (0.05, 1)]
    monkeypatch.delenv(memshare.ENV)
    memshare.apply("cuda")
    assert len(capped) == 2
