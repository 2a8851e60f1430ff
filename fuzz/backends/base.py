"""The adapter protocol every backend implements, and the one error type an adapter raises for a clean refusal.

An adapter translates the one canonical Case into its backend's spelling and back:

    available()        -> None, or why the backend cannot run on this machine (not installed, no GPU, ...)
    load()             -> None, or why its library does not import: the import available() starts with, which every
                          backend naming the same `library_module` shares (TE's three, FlashInfer's five), so a
                          caller asking many backends imports each library once
    unsupported(case)  -> None, or the reason this case is refused (like a skip's reason); cases refused here are
                          not drawn for the backend, and a replayed one is UNSUPPORTED, never PASS
    spellings(case)    -> the equivalent ways the backend's API can express this case ("" = the default spelling);
                          the fuzzer draws one into case.spelling, and every spelling is graded against the oracle
    run(case, tensors) -> Output in logical shapes, with `ran` naming what actually executed
    cases()            -> None, or a Hypothesis strategy of the cases it takes, for backends whose constraints the
                          general Space cannot express (context parallelism: lengths in units of 2 * world)
    version()          -> the backend library's version, recorded in corpus entries
    repro_source(case) -> None, or the source of `attention(q, k, v)` calling the backend's library directly as run()
                          does, for standalone repro scripts (fuzz/store/repro.py); None falls back to calling the
                          adapter through attnfuzz
    close()            -> release what the backend holds between cases (a context-parallel backend's rank pool)
    compile_key(case)  -> None, or what makes a JIT-compiled backend build a new kernel for the case (dtype, head
                          dims, which mask and score features are present, ...): cases of one key reuse one compiled
                          kernel, so the search draws many runtime variations under each key it has compiled
                          (strategies/compiled.py); None (the default): nothing is compiled per case

Adapters hold no module-level state and read no environment variables except where a backend demands them (TE),
and set none except FA4's persistent JIT cache (on unless the user turned it off).
"""

from __future__ import annotations

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors
from attnfuzz.oracles.verdict import Output


class Unsupported(Exception):
    """Raised by run() when the backend itself refuses the case at call time (e.g. no kernel for this shape).
    The message is the reason; the harness records the case as UNSUPPORTED, not as a crash."""


class Hang(Exception):
    """Raised by run() when the backend gave no answer within its timeout (a hung collective, a stuck kernel);
    the harness records the case as HANG."""


class Backend:
    """Base class with the defaults; subclasses set `name`, `family`, `device` and override what they need."""

    name: str = "backend"
    family: str = "default"     # row of the tolerance table (oracles/tolerance.py)
    device: str = "cpu"
    cost: float = 1.0           # relative cost of an example: a profile's example budget is divided by it
    deterministic: bool = False  # claims bitwise-reproducible results: each case runs twice and the bits must agree
    batch_invariant: bool = False  # claims a sequence's bits do not depend on its batch: on a share of the cases with
                                   # b > 1 it runs alone and the batch reversed, and the bits must agree (for the
                                   # others that check is an observation; attnfuzz.engine.batch)
    own_processes: bool = False  # runs its kernel in processes of its own already: no isolation worker around it
    compiles_to_disk: bool = True  # with a compile_key: a build is kept on disk for other processes (FA4's, FlashInfer's,
                                   # inductor's caches), so a warm-up before the workers start pays; cuDNN's graphs
                                   # live in the process only
    serves_paged: bool = False   # reads a paged KV cache when the case has one (strategies/paged.py); the others
                                 # would see the same logical k / v, so paged cases are not drawn for them
    serves_fp8: bool = False     # takes FP8 inputs and descales (strategies/fp8.py), and only those: every case
                                 # drawn for it is FP8, none for the others
    fp8_backward: bool = False   # runs an FP8 backward (strategies/fp8_backward.py): FP8 cases check gradients too
    build_errors: tuple[str, ...] = ()  # with a compile_key: the exception types of a kernel that fails to build,
                                        # which fails so for every case of its key (engine/compiled_search.py)
    library_module: str = ""     # the module load() imports; "" for a backend that needs nothing beyond torch

    def available(self) -> str | None:
        return None

    def load(self) -> str | None:
        return None

    def unsupported(self, case: Case) -> str | None:
        return None

    def spellings(self, case: Case) -> tuple[str, ...]:
        return ("",)

    def run(self, case: Case, tensors: Tensors) -> Output:
        raise NotImplementedError

    def cases(self):
        return None

    def version(self) -> str:
        return ""

    def repro_source(self, case: Case) -> str | None:
        return None

    def close(self) -> None:
        return None

    def compile_key(self, case: Case) -> tuple | None:
        return None

    def __repr__(self) -> str:
        return f"<backend {self.name} on {self.device}>"


def first_reason(*checks: tuple[bool, str]) -> str | None:
    """The reason of the first (refused, reason) pair whose condition holds: how adapters write capability rules."""
    for refused, reason in checks:
        if refused:
            return reason
    return None
