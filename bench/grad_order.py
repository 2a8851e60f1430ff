"""Which order a backend's fused backward rounds in, read off its gradients on one case: the share of dQ and dK
elements equal, bit for bit, to FlashAttention's order (dS rounded to the dtype, the softmax scale applied after the
sum) and to the scaled order (scale * dS rounded: cuDNN, torch's efficient kernel), and the case's grade under the
backend's own family.

    python3 bench/grad_order.py ENTRY.json --backends te-fused,sdpa-cudnn,sdpa-efficient,fa4 --device cuda

For a gradient failure near ratio 1 in fp16, where dS * scale sits among the subnormals: a kernel whose bits follow
the scaled order belongs in oracles/tolerance.py's SCALED_DS_ROUNDING, whose allowance is 1 / scale wider there; one
that follows neither order is computing something else. Both orders are written out on the CPU from the case's own
inputs (tests/fused_kernels.py: no softcap, ALiBi or sink); the backend runs on --device. A backend that cannot take
the entry's spelling runs the case with its first spelling for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.fused_kernels, from the repository root

import torch  # noqa: E402

from attnfuzz.backends import get  # noqa: E402
from attnfuzz.backends.base import Unsupported  # noqa: E402
from attnfuzz.oracles.grade import grade  # noqa: E402
from attnfuzz.strategies.case import Case  # noqa: E402
from attnfuzz.strategies.materialize import Tensors, draw, draw_device, with_storage  # noqa: E402
from tests.fused_kernels import flash_algorithm_backward  # noqa: E402

ORDERS = {"flash": False, "scaled": True}   # name -> flash_algorithm_backward's scaled_ds


def bit_shares(case: Case, t: Tensors, grads: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """Per order, per gradient (dq, dk): the share of the kernel's elements equal bit for bit to that order's, both
    written out from `t`, the case's plain inputs on the CPU."""
    shares = {}
    for order, scaled in ORDERS.items():
        _, dq, dk, _ = flash_algorithm_backward(case, t, scaled_ds=scaled)
        shares[order] = {name: (grads[name].cpu() == mine.to(t.q.dtype)).double().mean().item()
                         for name, mine in (("dq", dq), ("dk", dk))}
    return shares


def closer_order(shares: dict[str, dict[str, float]]) -> str:
    """The order whose bits the kernel matches more of, on dQ and dK together."""
    return max(shares, key=lambda order: sum(shares[order].values()))


def examine(case: Case, name: str, device: str) -> dict:
    """One backend on the case: its bit shares against both orders, the closer one, and its grade."""
    backend = get(name, device)
    spellings = backend.spellings(case)
    if case.spelling not in spellings and spellings:
        case = case.replace(spelling=spellings[0])
    reason = backend.available() or backend.unsupported(case)
    if reason is not None:
        return {"backend": name, "refused": reason}
    drawn = draw(case, draw_device(case, device))   # as the harness draws: a large case on the device itself
    try:
        output = backend.run(case, with_storage(case, drawn.to(device)))
    except Unsupported as e:   # a refusal at call time
        return {"backend": name, "refused": str(e)}
    if output.dq is None:
        return {"backend": name, "refused": "no gradients returned"}
    on_cpu = dataclasses.replace(output, **{n: getattr(output, n).cpu() for n in ("out", "lse", "dq", "dk", "dv")
                                            if getattr(output, n) is not None})
    plain = drawn.to("cpu")
    shares = bit_shares(case, plain, {"dq": on_cpu.dq, "dk": on_cpu.dk})
    verdict = grade(case, plain, on_cpu, family=backend.family)
    return {"backend": name, "family": backend.family, "shares": shares, "closer": closer_order(shares),
            "label": verdict.label, "ratio": verdict.ratio}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("entry", type=Path, help="a corpus entry, or any JSON with a 'case'")
    p.add_argument("--backends", required=True, help="comma-separated backend names")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    case = Case.from_dict(json.loads(args.entry.read_text())["case"])
    if not case.grads or case.softcap is not None or case.alibi_slopes or case.softmax != "vanilla":
        print(f"grad_order: {args.entry} needs gradients and no softcap, ALiBi or sink (the orders written out "
              "take none)", file=sys.stderr)
        return 2
    rows = [examine(case, name, args.device) for name in args.backends.split(",")]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        if "refused" in r:
            print(f"{r['backend']:16} not run: {r['refused']}")
            continue
        cells = "  ".join(f"{order} dq {s['dq']:.1%} dk {s['dk']:.1%}" for order, s in r["shares"].items())
        print(f"{r['backend']:16} {cells}  closer: {r['closer']:6}  {r['family']}: {r['label']} {r['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
