"""A process's share of its GPU's memory, where several campaign lanes share one GPU (attnfuzz.campaign.lanes).

The campaign hands each lane ATTNFUZZ_GPU_MEMORY_SHARE (bytes); the lane, its isolated workers (which inherit it) and
the cases they draw keep to it:
- the draw bounds each case's device memory by it (Space.max_bytes, attnfuzz.strategies.lengths.device_bytes);
- each process caps torch's caching allocator at it (torch.cuda.set_per_process_memory_fraction), so no lane can take
  memory another one needs, and none is killed for it;
- a case that still runs out of memory under the cap is refused (UNSUPPORTED, naming the share), not a CRASH: it
  asked for more than the lane's share, not for more than the GPU has. Without a share, an out-of-memory error stays
  a crash, as it is on a GPU of one's own.
"""

from __future__ import annotations

import os

ENV = "ATTNFUZZ_GPU_MEMORY_SHARE"
OOM_NEEDLES = ("CUDA out of memory", "OutOfMemoryError")


def share_bytes(environ=os.environ) -> int | None:
    """This process's share in bytes, None when it has the GPU to itself. A malformed value is an error naming it."""
    value = environ.get(ENV)
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{ENV}={value!r}: a number of bytes >= 1 (set by `attnfuzz campaign`), or unset")
    return int(value)


def inherited(environ=os.environ) -> dict[str, str]:
    """The share's variable as a child process must be handed it ({} without a share)."""
    return {ENV: environ[ENV]} if environ.get(ENV) else {}


def apply(device: str) -> None:
    """Cap torch's allocator on `device` at the share, if there is one and the device is a GPU."""
    share = share_bytes()
    if share is None or not str(device).startswith("cuda"):
        return
    import torch
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index   # torch's calls want the index itself
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, share / total), index)


def refusal(error: BaseException) -> str | None:
    """The refusal for an out-of-memory error under a share, else None (the error is what it was)."""
    share = share_bytes()
    text = f"{type(error).__name__}: {error}"
    if share is None or not any(needle in text for needle in OOM_NEEDLES):
        return None
    return (f"the case needs more GPU memory than this lane's share of {share / 2**30:.1f} GiB (several campaign "
            f"lanes share the GPU; fewer --workers give each lane more): {str(error).splitlines()[0][:200]}")
