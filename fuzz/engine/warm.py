"""Cold start: compile a JIT backend's plainest kernel configurations once, before the workers of a run fan out.

Every search starts near the plainest cases and every shrink ends near them, and a compile-aware search's index
shrinks toward the first configuration compiled: so every isolated worker and every campaign lane would compile
those first, each on its own, at the same moment. `python -m attnfuzz.engine.warm BACKEND [DEVICE]` runs them once
(the plainest case the backend takes, then it with one feature each: causal, a window, softcap, a sink, GQA, padding,
the other dtype, gradients; one case per compile key) and exits; with the backends' disk caches (FA4's CuTe DSL cache,
FlashInfer's JIT modules, inductor and Triton) shared by the processes that follow, they load those kernels instead of
compiling them. `attnfuzz campaign` does it for each backend that declares a compile key before it starts the lanes.
"""

from __future__ import annotations

import sys
import time

from attnfuzz.backends.base import Backend
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space, narrow_to

# One feature each, on top of the plainest case (a causal band's sinks and the like come with the search)
FEATURES = ({}, {"causal": True}, {"window": (8, None)}, {"softcap": 30.0}, {"softmax": "learnable"},
            {"h": 2, "hk": 1}, {"seqlens_q": (16,), "seqlens_kv": (16,)}, {"grads": True})


def plainest(backend: Backend, space: Space = Space()) -> list[Case]:
    """The plainest case `backend` takes (the narrowed space's first dtype and head dim: what shrinking walks toward)
    and those with one feature more, then in the other dtypes: one per compile key, refusals left out."""
    narrowed = narrow_to(space, backend.unsupported)
    dims = narrowed.head_dims or (64,)
    d = next((d for d in dims if d >= 64), dims[-1])   # a head dim kernels are tuned for, not the odd smallest
    cases, keys = [], set()
    for dtype in narrowed.dtypes:
        for fields in FEATURES:
            try:
                case = Case(sq=16, skv=16, d_qk=d, d_v=d, dtype=dtype, **fields)
            except ValueError:
                continue
            case = case.replace(spelling=backend.spellings(case)[0])
            key = backend.compile_key(case) if backend.unsupported(case) is None else None
            if key is not None and key not in keys:
                keys.add(key)
                cases.append(case)
    return cases


def warm(backend: Backend, device: str, space: Space = Space(), out=sys.stdout) -> int:
    """Run the plainest cases once (their verdicts are not kept: a failure there is the search's to find). Returns
    how many ran."""
    from attnfuzz.engine.harness import run_case
    cases = plainest(backend, space)
    start = time.perf_counter()
    for case in cases:
        run_case(backend, case, device=device)
    print(f"warm: {backend.name}: {len(cases)} kernel configurations in {time.perf_counter() - start:.1f} s", file=out)
    return len(cases)


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print("usage: python -m attnfuzz.engine.warm BACKEND [DEVICE]", file=sys.stderr)
        return 2
    from attnfuzz.backends import get
    try:
        backend = get(argv[0], argv[1] if len(argv) > 1 else "cuda")
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    unavailable = backend.available()
    if unavailable is not None:
        print(f"warm: {backend.name}: not available here ({unavailable}); nothing to compile", file=sys.stderr)
        return 0
    warm(backend, backend.device)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
