"""Poisoned device memory: output a kernel never writes reads NaN, every time.

A kernel that skips some output elements (TE FusedAttention's rows of a sequence with no keys) returns whatever the
memory held: 0 in a fresh process, where such a bug passes, stale values or NaN in a long-lived one, where it fails
now and then (corpus entries te-fused-FLAKY-*). With poisoning on, every block that torch's CUDA caching allocator
holds free is filled with 0xFF bytes (NaN in fp16, bf16, fp32 and fp64) right before the backend runs, and a reserve
of such blocks is kept in the cache, so the backend's outputs are cut from NaN memory: an element it never writes is
NaN and grades NONFINITE, in every process.

Turned on by ATTNFUZZ_POISON_MEMORY=1, which `attnfuzz run|replay|shrink|campaign --poison-memory` and
`pytest --poison-memory` set: campaign lanes inherit it, isolated workers are handed it (fuzz/engine/isolate.py). It does
nothing on the CPU (torch's CPU allocator keeps no cache to fill).
"""

from __future__ import annotations

import os

ENV = "ATTNFUZZ_POISON_MEMORY"
BYTE = 0xFF
SMALL_LIMIT = 1 << 20        # the caching allocator serves requests up to 1 MiB from its small pool (2 MiB segments)
RESERVE = {"small": 4 << 20, "large": 64 << 20}   # poisoned free bytes kept in each pool: new outputs come from them
PIECE = {"small": 256 << 10, "large": 16 << 20}   # what the reserve is allocated in
HELP = ("fill the CUDA caching allocator's free memory with NaN before every backend call, so output a kernel never "
        "writes reads NaN (NONFINITE) every time instead of 0 in a fresh process; no-op on the CPU")


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def enable() -> None:
    """Turn poisoning on for this process and every process it starts from now on."""
    os.environ[ENV] = "1"


def plan(snapshot: list[dict], device_index: int, stream: int) -> list[int]:
    """The allocations (bytes) that, held all at once, take every free block the allocator holds for the device and
    stream (torch.cuda.memory_snapshot()'s segments; best fit hands out the blocks of exactly each size), then top up
    each pool's free bytes to RESERVE. Free blocks of small segments are asked for in pieces of at most 1 MiB, so
    they are taken from the small pool. Once the reserve is in the cache, a plan asks for no new memory."""
    free = {"small": [], "large": []}
    for segment in snapshot:
        if (segment["device"] != device_index or segment.get("stream", stream) != stream
                or tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0)):  # CUDA graphs' private pools
            continue
        pool = segment.get("segment_type") or ("small" if segment["total_size"] <= 2 * SMALL_LIMIT else "large")
        free[pool] += [block["size"] for block in segment["blocks"] if block["state"] == "inactive"]
    sizes = sorted(free["large"], reverse=True)
    for size in sorted(free["small"], reverse=True):
        sizes += [SMALL_LIMIT] * (size // SMALL_LIMIT) + ([size % SMALL_LIMIT] if size % SMALL_LIMIT else [])
    for pool in ("large", "small"):
        short = RESERVE[pool] - sum(free[pool])
        sizes += [PIECE[pool]] * max(0, -(-short // PIECE[pool]))
    return sizes


def poison(device) -> None:
    """Fill the free memory of `device`'s caching allocator with BYTE (a no-op unless it is a CUDA device)."""
    import torch
    device = torch.device(device)
    if device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        stream = torch.cuda.current_stream().cuda_stream
        held = [torch.empty(size, dtype=torch.uint8, device=device)
                for size in plan(torch.cuda.memory_snapshot(), index, stream)]
        for block in held:
            block.fill_(BYTE)
        torch.cuda.synchronize()
        del held
