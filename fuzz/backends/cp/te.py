"""TransformerEngine's context parallelism (DotProductAttention with a CP group), one engine per comm type and
forced kernel; a call path of its own, independent of the non-CP TE adapter.

The translation from a Case to TE's spelling (`translate`) is a pure function, and the engine reaches TE only
through a `TEApi` loaded by name, so the whole path runs on CPU against a fake TE module in the tests. The only
environment variables touched are TE's backend switches (NVTE_FLASH_ATTN / NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN),
set in `forced_kernel` and nowhere else.

When TE finds no backend, the refusal quotes TE's own reasons: its backend selection logs them ("Disabling
FusedAttention: ...") at DEBUG, which `selection_log` collects for the one call without printing them.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
from dataclasses import dataclass, field

import torch

from attnfuzz.backends.base import Unsupported
from attnfuzz.backends.cp.capabilities import TE_COMM_TYPES, te_refusal
from attnfuzz.backends.cp.engine import CPEngine, LocalInputs, RankContext, RankOutput
from attnfuzz.backends.cp.shard import pack_padded, padded, unpack_padded
from attnfuzz.backends.te.selection import switched
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

SOFTMAX_TYPES = {"vanilla": "vanilla", "off_by_one": "off-by-one", "learnable": "learnable"}
A2A_GROUPS = [[0, 1], [2, 3]]   # a2a+p2p on 4 ranks: heads scattered inside each pair...
P2P_GROUPS = [[0, 2], [1, 3]]   # ...KV exchanged between the pairs (TE's own CP test uses this grid)


@dataclass(frozen=True)
class TECall:
    """One case in TE's spelling: DotProductAttention(**init), forward(q, k, v, **cu_seqlens), with the NVTE_*
    switches in `env` forcing the kernel."""

    init: dict
    cu_seqlens: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)


def translate(case: Case, kernel: str, world: int) -> TECall:
    """The case as TE spells it. Unbounded window sides are -1; a band with right bound 0 is a causal mask type
    (bottom-right alignment only reaches here with sq == skv, where it equals top-left)."""
    causal = case.right == 0
    if case.layout == "thd":
        mask = "padding_causal" if causal else "padding"
    else:
        mask = "causal" if causal else "no_mask"
    left = -1 if case.left is None else case.left
    window = (left, 0) if causal else ((-1, -1) if case.window == (None, None) else (left, case.right))
    init = {"num_attention_heads": case.h, "kv_channels": (case.d_qk, case.d_v), "num_gqa_groups": case.hk,
            "attention_dropout": 0.0, "qkv_format": case.layout, "attn_mask_type": mask, "window_size": window,
            "softmax_scale": case.softmax_scale, "softmax_type": SOFTMAX_TYPES[case.softmax]}
    cu = {}
    if case.layout == "thd":
        def cumsum(lens):
            out = [0]
            for n in lens:
                out.append(out[-1] + n)
            return out
        cu = {"cu_seqlens_q": cumsum(case.lens_q), "cu_seqlens_kv": cumsum(case.lens_kv),
              "cu_seqlens_q_padded": cumsum(padded(case.lens_q, 2 * world)),
              "cu_seqlens_kv_padded": cumsum(padded(case.lens_kv, 2 * world))}
    env = {"NVTE_FLASH_ATTN": "1" if kernel == "flash" else "0", "NVTE_FUSED_ATTN": "1" if kernel == "fused" else "0",
           "NVTE_UNFUSED_ATTN": "0"}
    return TECall(init=init, cu_seqlens=cu, env=env)


def forced_kernel(env: dict[str, str], backends_state: dict):
    """TE's backend switches for one call, TE made to select again (te.selection.switched)."""
    return switched(env, lambda: backends_state, stale_after=True)


@dataclass
class TEApi:
    """What the engine needs from TE: the module class, TE's backend-selection cache, a CUDA stream maker, the
    version, and TE's AttentionLogging class (whose `_log_level` TE's selection reads; None: no reasons)."""

    DotProductAttention: type
    backends_state: dict
    stream: object
    version: str
    attention_logging: object | None = None


TE_LOGGER = "DotProductAttention"
NO_BACKEND = "No dot product attention backend is available"


class _Collect(logging.Handler):
    def __init__(self, records: list[str]):
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


@contextlib.contextmanager
def selection_log(attention_logging):
    """Collect the messages TE's backend selection logs during the block (a list, filled as it goes). TE sets its
    logger's level from `AttentionLogging._log_level` on every selection, so that is lowered to DEBUG for the block;
    TE's own handlers are held at WARNING and propagation is off, so nothing is printed."""
    records: list[str] = []
    if attention_logging is None:
        yield records
        return
    logger = logging.getLogger(TE_LOGGER)
    saved = (attention_logging._log_level, logger.level, logger.propagate, [(h, h.level) for h in logger.handlers])
    handler = _Collect(records)
    for h in logger.handlers:
        h.setLevel(max(h.level, logging.WARNING))
    attention_logging._log_level, logger.propagate = logging.DEBUG, False
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        attention_logging._log_level, level, logger.propagate, handlers = saved
        logger.setLevel(level)
        for h, lvl in handlers:
            h.setLevel(lvl)


def refusal_reasons(records: list[str], kernel: str) -> str:
    """TE's reasons for disabling the forced kernel (its own NVTE_* switches left out), deduplicated, with the
    per-step config dicts cut short."""
    want = {"fused": "Disabling FusedAttention", "flash": "Disabling FlashAttention"}[kernel]
    seen: list[str] = []
    for msg in records:
        if msg.startswith(want) and "NVTE_" not in msg:
            msg = re.sub(r" \(context-parallel per-step config \{.*\}\)", " (a CP per-step config)", msg)
            if msg not in seen:
                seen.append(msg)
    return "; ".join(seen)


def real_te_api() -> TEApi:
    try:
        from attnfuzz.backends.te.adapter import import_te
        te = import_te()
        import transformer_engine
        from transformer_engine.pytorch.attention.dot_product_attention import dot_product_attention as dpa_mod
    except ImportError as e:
        raise Unsupported(f"TransformerEngine is not importable here ({e}); see shared/gpu/README.md") from None
    try:
        from transformer_engine.pytorch.attention.dot_product_attention.utils import AttentionLogging
    except ImportError:
        AttentionLogging = None
    return TEApi(te.DotProductAttention, dpa_mod._attention_backends, torch.cuda.Stream,
                 getattr(transformer_engine, "__version__", "?"), AttentionLogging)


def load_api(spec: str) -> TEApi:
    """A TEApi from 'module:function' (the real TE by default; tests name a fake)."""
    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)()


def ran_kernel(state: dict) -> str:
    """Which kernel TE's backend selection chose, read from its cache after the call."""
    if state.get("use_flash_attention"):
        return f"FlashAttention ({state.get('flash_attention_backend')})"
    if state.get("use_fused_attention"):
        return f"FusedAttention (sub-backend {int(state.get('fused_attention_backend'))})"
    if state.get("use_unfused_attention"):
        return "UnfusedDotProductAttention"
    return "none"


def to_te(case: Case, x: torch.Tensor, packed: bool) -> torch.Tensor:
    """Logical [b, s, heads, d] (or packed [t, heads, d]) -> the case's qkv_format, contiguous."""
    if packed:
        return x.contiguous()
    return (x.transpose(0, 1) if case.layout == "sbhd" else x).contiguous()


def from_te(case: Case, y: torch.Tensor, heads: int, packed: bool) -> torch.Tensor:
    """TE's output ([..., heads * d] or [..., heads, d]) in the case's format -> logical [b, s, heads, d] or
    packed [t, heads, d]."""
    y = y.reshape(*y.shape[:2 - packed], heads, -1)
    return y.transpose(0, 1) if case.layout == "sbhd" and not packed else y


@dataclass(frozen=True)
class TEEngine(CPEngine):
    """TE DotProductAttention with cp_comm_type=`comm_type`, forced to `kernel` ("fused" or "flash"). `cudnn` is
    the cuDNN version TE runs with (torch's spelling, e.g. 91800; None: unknown); `table=False` lets every case
    through to TE (to read TE's own reason for a refusal the table declares)."""

    comm_type: str = "p2p"
    kernel: str = "fused"
    world: int = 2
    api: str = "attnfuzz.backends.cp.te:real_te_api"
    cudnn: int | None = None
    table: bool = True

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"te-cp-{self.comm_type}-{self.kernel}"

    def convention(self, case: Case) -> str:
        return "dual_chunk"

    def unsupported(self, case: Case) -> str | None:
        return te_refusal(case, self.comm_type, self.kernel, self.world, self.cudnn) if self.table else None

    def cp_group(self, ctx: RankContext):
        if self.comm_type == "a2a+p2p":
            return [ctx.subgroups("a2a", A2A_GROUPS)[0], ctx.subgroups("p2p", P2P_GROUPS)[0]]
        return ctx.group

    def _module(self, api: TEApi, call: TECall, case: Case, device, sink):
        dpa = api.DotProductAttention(**call.init)
        if hasattr(dpa, "to"):
            dpa = dpa.to(device)
        if case.softmax == "learnable":
            with torch.no_grad():
                dpa.softmax_offset.copy_(sink.to(dpa.softmax_offset))
        return dpa

    def _forward(self, api, call, dpa, case, q, k, v, dout, packed, device) -> RankOutput:
        cu = {name: torch.tensor(vals, dtype=torch.int32, device=device) for name, vals in call.cu_seqlens.items()}
        q, k, v = (to_te(case, x, packed).requires_grad_(case.grads) for x in (q, k, v))
        with forced_kernel(call.env, api.backends_state), selection_log(api.attention_logging) as log:
            try:
                out = dpa(q, k, v, **cu)
            except ValueError as e:
                if NO_BACKEND not in str(e):
                    raise
                why = refusal_reasons(log, self.kernel)
                raise Unsupported(f"TE {api.version}: no backend for this case with {self.kernel} forced"
                                  + (f": {why}" if why else "")) from None
            ran = ran_kernel(api.backends_state)
            if case.grads:
                out.backward(to_te(case, dout, packed).reshape(out.shape))
        result = RankOutput(out=from_te(case, out.detach(), case.h, packed), ran=ran)
        if case.grads:
            result.dq = from_te(case, q.grad, case.h, packed)
            result.dk = from_te(case, k.grad, case.hk, packed)
            result.dv = from_te(case, v.grad, case.hk, packed)
        return result

    def _check_ran(self, ran: str) -> None:
        want = {"fused": "FusedAttention", "flash": "FlashAttention"}[self.kernel]
        if not ran.startswith(want):
            raise RuntimeError(f"{self.name}: forced {want} but TE ran {ran}")

    def run_rank(self, ctx: RankContext, case: Case, local: LocalInputs) -> RankOutput:
        reason = self.unsupported(case)
        if reason:
            raise Unsupported(reason)
        if ctx.world != TE_COMM_TYPES[self.comm_type]:
            raise ValueError(f"{self.name} needs {TE_COMM_TYPES[self.comm_type]} ranks, the pool has {ctx.world}")
        api = load_api(self.api)
        call = translate(case, self.kernel, ctx.world)
        dpa = self._module(api, call, case, ctx.device, local.whole.sink)
        dpa.set_context_parallel_group(self.cp_group(ctx), list(range(ctx.world)), api.stream(), self.comm_type)
        result = self._forward(api, call, dpa, case, local.q, local.k, local.v, local.dout, local.packed, ctx.device)
        self._check_ran(result.ran)
        result.ran = f"TE {api.version} cp_comm_type={self.comm_type} {result.ran}"
        return result

    def run_whole(self, ctx: RankContext, case: Case, tensors: Tensors) -> RankOutput:
        """The same module without a CP group on the whole sequence (what TE's own CP suite compares with)."""
        api = load_api(self.api)
        call = translate(case, self.kernel, ctx.world)
        dpa = self._module(api, call, case, ctx.device, tensors.sink)
        packed = case.layout == "thd"
        pq, pkv = padded(case.lens_q, 2 * ctx.world), padded(case.lens_kv, 2 * ctx.world)

        def prep(x, lens, pads):
            return pack_padded(x, lens, pads) if packed else x
        dout = prep(tensors.dout, case.lens_q, pq) if tensors.dout is not None else None
        r = self._forward(api, call, dpa, case, prep(tensors.q, case.lens_q, pq), prep(tensors.k, case.lens_kv, pkv),
                          prep(tensors.v, case.lens_kv, pkv), dout, packed, ctx.device)
        if packed:
            r.out = unpack_padded(r.out, case.lens_q, pq, case.sq)
            for name, lens, pads, s in (("dq", case.lens_q, pq, case.sq), ("dk", case.lens_kv, pkv, case.skv),
                                        ("dv", case.lens_kv, pkv, case.skv)):
                if getattr(r, name) is not None:
                    setattr(r, name, unpack_padded(getattr(r, name), lens, pads, s))
        return r
