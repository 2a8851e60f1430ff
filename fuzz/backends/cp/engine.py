"""The contract between the worker pool and a context-parallel engine (torch ring attention, TE's CP comm types).

An engine is a small picklable object. The pool sends it with each case to every rank; each rank materializes the
case's tensors from the seed, cuts its shard out with the engine's convention (fuzz/backends/cp/shard.py), and calls

    engine.run_rank(ctx, case, local) -> RankOutput

on every rank at once. The pool gathers the pieces and un-permutes them; the engine never sees the whole sequence
(except in `run_whole`, the optional non-CP run of the same backend, kept only as a second signal).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors


@dataclass
class RankContext:
    """What a rank knows about its place: its rank, the world size, its device and the world's process group.
    `groups` holds sub-groups made with `subgroups()`, cached for the life of the worker."""

    rank: int
    world: int
    device: torch.device
    group: object
    groups: dict = field(default_factory=dict)

    def subgroups(self, key: str, rank_lists: list[list[int]]):
        """The group of each rank list that holds this rank, in order. Every rank must call this with the same
        lists (dist.new_group is collective); the groups are made once per key."""
        import torch.distributed as dist

        if key not in self.groups:
            made = [(ranks, dist.new_group(ranks)) for ranks in rank_lists]
            self.groups[key] = [g for ranks, g in made if self.rank in ranks]
        return self.groups[key]


@dataclass
class LocalInputs:
    """This rank's shard. Batched plans: q [b, s_loc, h, d_qk], k/v [b, skv_loc, hk, d], dout like q's rows;
    packed (thd) plans: q [t_loc, h, d_qk], k/v [tkv_loc, hk, d]. `q_pos` / `kv_pos` are the positions on the
    (packed) token axis this rank holds; `whole` the full tensors, for the engine's own checks only."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor | None
    q_pos: torch.Tensor
    kv_pos: torch.Tensor
    packed: bool
    padded_q: tuple[int, ...] | None
    padded_kv: tuple[int, ...] | None
    whole: Tensors


@dataclass
class RankOutput:
    """One rank's pieces, laid out like its LocalInputs: out like q (with d_v), lse [b, h, s_loc] or [h, t_loc]
    (natural log) or None, grads like q/k/v or None. `ran` names what executed on this rank."""

    out: torch.Tensor
    lse: torch.Tensor | None = None
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None
    ran: str = ""


class CPEngine:
    """Base class. Subclasses set `name` and `world` and implement `convention`, `unsupported` and `run_rank`."""

    name: str = "cp-engine"
    world: int = 2

    def convention(self, case: Case) -> str:
        """The sharding convention for this case (one of attnfuzz.backends.cp.shard.CONVENTIONS)."""
        raise NotImplementedError

    def unsupported(self, case: Case) -> str | None:
        """None, or why the engine cannot take this case."""
        return None

    def run_rank(self, ctx: RankContext, case: Case, local: LocalInputs) -> RankOutput:
        raise NotImplementedError

    def run_whole(self, ctx: RankContext, case: Case, tensors: Tensors) -> RankOutput | None:
        """The same backend without context parallelism on the whole sequence (logical shapes), or None when the
        engine has no such run. Only ever a second signal: never the grader."""
        return None

    def __repr__(self) -> str:
        return f"<cp engine {self.name} world={self.world}>"
