"""Save what a backend returned for corpus entries, so its grading can be examined on a machine without the backend.

    python3 bench/dump_outputs.py OUT.pt ENTRY.json... [--device cuda]

For each entry: the case, and the backend's out / lse / dq / dk / dv moved to the CPU. `grade(case, materialize(case),
Output(**saved))` on any machine then grades the same numbers the backend gave (inputs are rebuilt bit for bit from
the case's seed where the case has fewer than materialize.DEVICE_DRAW_FROM input elements; a larger one is drawn by
the GPU's own generator, and only that GPU model rebuilds it), which is how a grader change is checked against a real
kernel's rounding without the kernel.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attnfuzz.store import corpus as corpus_io
from attnfuzz.backends import get
from attnfuzz.strategies.materialize import materialize


def dump(paths: list[Path], device: str) -> list[dict]:
    saved = []
    for path in paths:
        entry = corpus_io.load(path)
        backend = get(entry.backend, device)
        why = backend.available() or backend.unsupported(entry.case)
        if why:
            print(f"{path.name}: skipped: {why}", file=sys.stderr)
            continue
        output = backend.run(entry.case, materialize(entry.case, device))
        tensors = {name: getattr(output, name) for name in ("out", "lse", "dq", "dk", "dv")}
        saved.append({"entry": path.name, "backend": entry.backend, "case": entry.case.to_dict(),
                      **{k: (v.detach().cpu() if v is not None else None) for k, v in tensors.items()}})
        print(f"{path.name}: saved", file=sys.stderr)
    return saved


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("entries", nargs="+", type=Path)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    torch.save(dump(args.entries, args.device), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
