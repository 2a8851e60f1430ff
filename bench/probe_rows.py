"""Which reference each query row of a corpus entry's output matches: the case itself, or one of the diagnoses'
alternatives (other alignment, window bound off by one, no mask, ...). For a FAIL:TOLERANCE whose rows fail in
different ways, which no single diagnosis then names.

    python3 bench/probe_rows.py corpus/ENTRY.json [--device cuda]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attnfuzz.backends import get
from attnfuzz.store.corpus import load
from attnfuzz.oracles.grade import alternatives, valid_rows
from attnfuzz.oracles.reference import reference
from attnfuzz.strategies.materialize import draw_on_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("entry", type=Path)
    parser.add_argument("--device", default=None, help="default: the entry's device")
    args = parser.parse_args()
    entry = load(args.entry)
    case, device = entry.case, args.device or entry.device
    drawn = draw_on_cpu(case)
    out = get(entry.backend, device).run(case, drawn.to(device)).out.detach().to("cpu", torch.float64)
    refs = {"the case": reference(case, drawn, grads=False).out}
    for diagnosis, description, overrides in alternatives(case):
        alt_case = overrides.pop("case", case)
        refs[f"{diagnosis}: {description}"] = reference(alt_case, drawn, grads=False, **overrides).out
    rows = valid_rows(case, "cpu")
    names = list(refs)
    print(f"{entry.backend} on {device}: {case}")
    for i, name in enumerate(names):
        print(f"  [{i}] {name}")
    print("  seq row: max|out - ref[i]| for each i (* nearest)")
    for b in range(case.b):
        for r in range(case.sq):
            if not rows[b, r]:
                continue
            diffs = [(out[b, r] - refs[n][b, r]).abs().max().item() for n in names]
            best = min(range(len(diffs)), key=diffs.__getitem__)
            cells = " ".join(f"{d:9.2e}{'*' if i == best else ' '}" for i, d in enumerate(diffs))
            print(f"  {b:3d} {r:4d}: {cells}")


if __name__ == "__main__":
    main()
