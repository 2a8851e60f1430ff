"""Does a backend leave output elements unwritten? Fill the free memory of torch's CUDA caching allocator with a byte
pattern, run a corpus entry's case, and count the output elements that still hold the pattern. Elements that come
back as the pattern under every fill were never written: their value is whatever the memory held (0 in a fresh
process, stale values or NaN in a long-lived one), which is how a FLAKY entry flakes.

    python3 bench/probe_unwritten.py corpus/ENTRY.json [--runs 3]

Fills: none (the allocator as it is), 0xFF (NaN in fp16, bf16 and fp32), 0x42 (finite: 3.13 in fp16, 48.5 in bf16)
and 0x00. Beside the unwritten rows it prints the largest |output| of the rows that see a key (0: all-zero).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attnfuzz.backends import get
from attnfuzz.store.corpus import load
from attnfuzz.oracles.grade import valid_rows
from attnfuzz.oracles.reference import reference
from attnfuzz.strategies.materialize import draw_on_cpu

FILLS = (None, 0xFF, 0x42, 0x00)


def fill_free_memory(byte: int) -> None:
    """Empty the allocator's cache, then hand it back blocks holding `byte` everywhere: 64 of 512 KiB (its small
    pool, which serves allocations up to 1 MiB) and 4 of 64 MiB (the large pool); later allocations are cut from
    them."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    blocks = [torch.full((512 << 10,), byte, dtype=torch.uint8, device="cuda") for _ in range(64)]
    blocks += [torch.full((64 << 20,), byte, dtype=torch.uint8, device="cuda") for _ in range(4)]
    torch.cuda.synchronize()
    del blocks


def holds_pattern(out: torch.Tensor, byte: int) -> torch.Tensor:
    """Elements of `out` whose every byte is `byte`."""
    raw = out.detach().contiguous().view(torch.uint8).reshape(*out.shape, out.element_size())
    return (raw == byte).all(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("entry", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    entry = load(args.entry)
    case = entry.case
    backend = get(entry.backend, "cuda")
    drawn = draw_on_cpu(case)
    empty = reference(case, drawn, grads=False).empty  # [b, sq] rows that see no key
    rows = valid_rows(case, "cpu")
    print(f"{entry.backend}: {case}\n  valid rows that see no key: {int((empty & rows).sum())} of {int(rows.sum())}")
    seen = rows & ~empty
    for byte in FILLS:
        for run in range(args.runs):
            if byte is not None:
                fill_free_memory(byte)
            out = backend.run(case, drawn.to("cuda")).out
            torch.cuda.synchronize()
            hit = holds_pattern(out, byte).cpu().flatten(2).all(-1) if byte is not None else torch.zeros_like(rows)
            host = out.float().cpu()
            print(f"  fill {'none' if byte is None else f'0x{byte:02X}'} run {run}: rows left as the fill: "
                  f"{int((hit & rows).sum())} (of them empty: {int((hit & rows & empty).sum())}); non-finite "
                  f"elements: {int((~torch.isfinite(host)).sum())}; max |empty rows|: "
                  f"{host[empty & rows].abs().max().item() if (empty & rows).any() else 0:.4g}; max |rows that see "
                  f"a key|: {host[seen].abs().max().item() if seen.any() else 0:.4g}")


if __name__ == "__main__":
    main()
