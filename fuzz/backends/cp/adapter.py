"""Context-parallel backends: torch ring attention (ring-allgather, ring-alltoall; 2 ranks) and TransformerEngine's
CP comm types (te-cp-<comm>-<kernel>: p2p, all_gather, a2a on 2 ranks, a2a+p2p on 4; kernel fused or flash).

Each backend runs its engine on a persistent worker pool (fuzz/backends/cp/pool.py: gloo on CPU, NCCL on CUDA, one GPU per
rank), gathers the shards back into one Output in logical shapes, and is graded like any adapter against the
float64 oracle of the whole sequence. The non-CP run of the same backend is compared too, as a second signal in
`Output.ran` (and `last_agreement`), never as the grader.
"""

from __future__ import annotations

import importlib.util

from attnfuzz.backends.base import Backend, Unsupported
from attnfuzz.backends.cp.agreement import Agreement, cp_vs_nocp
from attnfuzz.backends.cp.capabilities import TE_COMM_TYPES, TE_KERNELS
from attnfuzz.backends.cp.engine import CPEngine
from attnfuzz.backends.cp.outcome import CollectiveHang, RankCrash, crash_message
from attnfuzz.backends.cp.pool import ERROR, HANG, OK, UNSUPPORTED, CPPool
from attnfuzz.backends.cp.ring import RingEngine
from attnfuzz.backends.cp.te import TEEngine
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors


class CPBackend(Backend):
    """A CP engine behind the Backend protocol. `pool` may be shared between backends of the same world size and
    device; without one, the backend starts its own on first use (close() stops it)."""

    family = "default"
    own_processes = True  # the kernel already runs in rank processes (fuzz/backends/cp/pool.py): a crash costs one case

    def __init__(self, engine: CPEngine, device: str = "cpu", *, pool: CPPool | None = None, compare: bool = True,
                 timeout_s: float = 120.0):
        self.engine, self.device, self.compare, self.timeout_s = engine, device, compare, timeout_s
        self.name = engine.name
        self._pool, self._owns_pool = pool, pool is None
        self.last_agreement: Agreement | None = None
        self.last_nocp: Output | None = None

    def _device_kind(self) -> str:
        return "cuda" if self.device.startswith("cuda") else "cpu"

    def available(self) -> str | None:
        import torch
        import torch.distributed as dist

        if not dist.is_available():
            return "torch.distributed is not available in this torch build"
        if self._device_kind() == "cuda" and torch.cuda.device_count() < self.engine.world:
            return f"{self.name} needs {self.engine.world} GPUs, found {torch.cuda.device_count()}"
        if isinstance(self.engine, TEEngine):
            if self._device_kind() == "cpu":
                return "TransformerEngine context parallelism runs on CUDA only"
            if importlib.util.find_spec("transformer_engine") is None:
                return "transformer_engine is not installed (see shared/gpu/README.md: pack.sh te)"
        return None

    def unsupported(self, case: Case) -> str | None:
        return self.engine.unsupported(case)

    def spellings(self, case: Case) -> tuple[str, ...]:
        if isinstance(self.engine, RingEngine):
            return ("", "head_tail", "contiguous") if case.causal else ("", "contiguous")
        return ("",)

    def cases(self, **bounds):
        """The Hypothesis strategy of cases this backend takes (attnfuzz.backends.cp.cases.cp_cases): lengths in the engine's
        chunk units, so the harness should draw from it rather than narrow the general space."""
        from attnfuzz.backends.cp.cases import cp_cases

        return cp_cases(self.engine, **bounds)

    def pool(self) -> CPPool:
        if self._pool is None:
            self._pool = CPPool(self.engine.world, device=self._device_kind(), timeout_s=self.timeout_s)
        return self._pool

    def run(self, case: Case, tensors: Tensors) -> Output:
        """Run on every rank (the ranks draw their own tensors from case.seed; `tensors` are the oracle's copy)."""
        self.last_agreement, self.last_nocp = None, None
        result = self.pool().run(self.engine, case, whole=self.compare)
        if result.status == UNSUPPORTED:
            raise Unsupported(result.message)
        if result.status == HANG:
            raise CollectiveHang(result.message, result.saved)
        if result.status == ERROR:
            raise RankCrash(crash_message(self.name, result.message, result.rank_errors))
        assert result.status == OK and result.output is not None
        output = result.output
        if result.whole is not None:
            self.last_nocp = result.whole
            self.last_agreement = cp_vs_nocp(case, output, result.whole)
            output.ran = f"{output.ran}; {self.last_agreement.describe()}"
        return output

    def repro_source(self, case: Case) -> str | None:
        """Source of `attention(q, k, v)` spawning the ranks and running the engine on each, for standalone repro
        scripts (fuzz/store/repro.py); None for a case the engine does not take."""
        from attnfuzz.backends.cp.repro import cp_source
        return cp_source(self, case)

    def version(self) -> str:
        import torch

        if isinstance(self.engine, TEEngine):
            from attnfuzz.backends.te.adapter import te_version
            return f"transformer_engine {te_version() or 'not installed'}, torch {torch.__version__}"
        return f"torch {torch.__version__}"

    def close(self) -> None:
        if self._pool is not None and self._owns_pool:
            self._pool.close()
            self._pool = None


def _ring(rotate: str):
    return lambda device: CPBackend(RingEngine(rotate, 2, "cuda" if device.startswith("cuda") else "cpu"), device)


def cudnn_version(device: str) -> int | None:
    """The cuDNN version torch loads on CUDA (TE loads the same library on the runner), e.g. 91800; None on CPU."""
    if not device.startswith("cuda"):
        return None
    import torch
    try:
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except RuntimeError:  # torch refuses a cuDNN of another version on the library path: say none, not crash
        return None


def _te(comm: str, kernel: str):
    return lambda device: CPBackend(TEEngine(comm, kernel, TE_COMM_TYPES[comm], cudnn=cudnn_version(device)), device)


BACKENDS = {"ring-allgather": _ring("allgather"), "ring-alltoall": _ring("alltoall"),
            **{f"te-cp-{comm}-{kernel}": _te(comm, kernel) for comm in TE_COMM_TYPES for kernel in TE_KERNELS}}
