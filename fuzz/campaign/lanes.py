"""How many lanes a campaign runs on each GPU by default, and each lane's share of its GPU's memory.

A small case costs the host far more than the GPU (drawing, probing, grading: docs/performance.md), so one lane
leaves an H200 mostly idle; lanes are separate processes, each with its own Hypothesis stream. The default is the
most lanes per GPU that all three of these allow (`--workers` overrides it):
- cores: a lane and its isolated worker take turns, so each keeps about one core busy; one core is left for the
  campaign process, and the GPUs share the rest;
- GPU memory: each lane gets an equal share of 90 % of the GPU, less its processes' CUDA contexts, and a share
  below MIN_SHARE_BYTES is too small for the long cases of the default space;
- host memory: LANE_HOST_BYTES per lane (a lane and its worker each hold torch, CUDA and a kernel library), within
  80 % of the host's (or the container's) memory.

The share bounds what a lane's cases may hold and what its processes may allocate (attnfuzz.engine.memshare). Lanes
share the compile caches, which are safe for processes working at once (each writes a new entry under a temporary
name and renames it into place, or under a file lock): inductor's (write_atomic), Triton's (FileCacheManager.put),
FA4's CuTe DSL cache (flash_attn/cute/cache_utils.py: an fcntl lock per entry) and FlashInfer's JIT modules (a
FileLock per module, flashinfer/jit/core.py). Every lane is handed the same directories (shared_cache_env).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

GPU_USABLE = 0.9
CONTEXT_BYTES = 3 * 2**29          # a lane's processes' CUDA contexts (the lane, its worker, a spare): ~0.5 GiB each
MIN_SHARE_BYTES = 4 * 2**30
LANE_HOST_BYTES = 6 * 2**30
HOST_USABLE = 0.8


@dataclass(frozen=True)
class Sizing:
    """Lanes per GPU, what each bound allowed, and each lane's share of its GPU's memory in bytes."""
    per_gpu: int
    by_cores: int
    by_gpu_memory: int
    by_host_memory: int
    share_bytes: int

    def describe(self, gpus: int) -> str:
        return (f"{self.per_gpu} lane(s) per GPU on {gpus} GPU(s), the most that the host's cores ({self.by_cores}), "
                f"the GPU's memory ({self.by_gpu_memory}) and the host's memory ({self.by_host_memory}) allow; each "
                f"lane may hold {self.share_bytes / 2**30:.1f} GiB of its GPU (--workers N sets the lanes per GPU)")


def size(cores: int, gpus: int, gpu_bytes: int, host_bytes: int, per_gpu: int | None = None) -> Sizing:
    """The default sizing for `gpus` GPUs of `gpu_bytes` each on a host of `cores` cores and `host_bytes`; `per_gpu`
    (--workers) overrides the count, and the share follows it."""
    usable = gpu_bytes * GPU_USABLE
    by_cores = max(1, (cores - 1) // max(gpus, 1))
    by_gpu = max(1, int(usable // (MIN_SHARE_BYTES + CONTEXT_BYTES)))
    by_host = max(1, int(host_bytes * HOST_USABLE // (LANE_HOST_BYTES * max(gpus, 1))))
    lanes = per_gpu or min(by_cores, by_gpu, by_host)
    share = max(2**30, int(usable / lanes - CONTEXT_BYTES))
    return Sizing(lanes, by_cores, by_gpu, by_host, share)


def host_cores() -> int:
    """The cores this process may use: its affinity, within a container's CPU quota (cgroup v2 cpu.max)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _read("/sys/fs/cgroup/cpu.max").split()
    if len(quota) == 2 and quota[0].isdigit() and quota[1].isdigit() and int(quota[1]) > 0:
        cores = min(cores, max(1, int(quota[0]) // int(quota[1])))
    return cores


def host_memory_bytes() -> int:
    """The host's memory, within a container's limit (cgroup v2 memory.max)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _read("/sys/fs/cgroup/memory.max").strip()
    return min(total, int(limit)) if limit.isdigit() else total


def gpu_memory_bytes() -> int:
    """The first visible GPU's memory (the campaign's GPUs are taken to be alike)."""
    import torch
    return torch.cuda.get_device_properties(0).total_memory


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
