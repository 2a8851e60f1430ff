"""The TE context-parallel call path on CPU, against a fake TE: the translation to TE's spelling, the forced-kernel
switches, the CP group wiring, and the layout round trip through sharding and gathering. (TE itself runs on the
GPU runner only; see bench/cp_check.py.)"""

from __future__ import annotations

import logging
import os

import pytest
import torch

from attnfuzz.backends.base import Unsupported
from attnfuzz.backends.cp import shard, te as te_mod
from attnfuzz.backends.cp.engine import RankContext
from attnfuzz.backends.cp.pool import gather
from attnfuzz.backends.cp.te import TEApi, TEEngine, translate
from attnfuzz.backends.cp.worker import local_inputs
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize

NVTE = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")


class FakeAttentionLogging:
    """TE's AttentionLogging: the level TE's backend selection sets its logger to on every selection."""

    _log_level = logging.WARNING


def make_fake_api(selects: str | None = None, refuse: bool = False, logs: bool = True) -> tuple[TEApi, list[dict]]:
    """A fake TE whose DotProductAttention returns 2*q (so layouts can be checked) and records every call.
    It selects the kernel the NVTE_* switches ask for, or `selects` when given. Refusing, it logs its reasons at
    DEBUG the way TE 2.20.2's get_attention_backend does (logger level reset from AttentionLogging each time)."""
    calls: list[dict] = []
    state = {"backend_selection_requires_update": False}

    class FakeDPA:
        def __init__(self, **init):
            self.init = init
            self.softmax_offset = torch.zeros(init["num_attention_heads"]) if init["softmax_type"] != "vanilla" \
                else None

        def set_context_parallel_group(self, group, ranks, stream, comm_type):
            self.cp = (group, ranks, stream, comm_type)

        def __call__(self, q, k, v, **cu):
            if refuse:
                logger = logging.getLogger("DotProductAttention")
                logger.setLevel(FakeAttentionLogging._log_level)
                logger.debug("Disabling FlashAttention due to NVTE_FLASH_ATTN=0")
                for _ in range(2):  # one reason per per-step config: the refusal lists it once
                    logger.debug("Disabling FusedAttention: %s%s", "planted reject message",
                                 " (context-parallel per-step config {'max_seqlen_q': 1})")
                raise ValueError("No dot product attention backend is available for the provided inputs.")
            calls.append({"init": self.init, "cp": getattr(self, "cp", None), "cu": cu,
                          "env": {n: os.environ.get(n) for n in NVTE},
                          "reselect": state["backend_selection_requires_update"],
                          "offset": None if self.softmax_offset is None else self.softmax_offset.clone(),
                          "shapes": (q.shape, k.shape, v.shape), "contiguous": q.is_contiguous()})
            kernel = selects or ("fused" if os.environ.get("NVTE_FUSED_ATTN") == "1" else "flash")
            state.update(use_flash_attention=kernel == "flash", flash_attention_backend="4.0.0b36",
                         use_fused_attention=kernel == "fused", fused_attention_backend=1,
                         use_unfused_attention=False, backend_selection_requires_update=False)
            out = 2 * q + 0 * (k.sum() + v.sum())
            return out.reshape(*q.shape[:-2], -1)

    return TEApi(FakeDPA, state, lambda: "stream", "fake-2.20.2", FakeAttentionLogging if logs else None), calls


class FakeContext(RankContext):
    def subgroups(self, key, rank_lists):
        return [f"{key}{ranks}" for ranks in rank_lists if self.rank in ranks]


def run_all_ranks(engine: TEEngine, case: Case, api: TEApi, monkeypatch):
    """Every rank's run_rank in this process, then the pool's gather: what the pool would hand back."""
    monkeypatch.setattr(te_mod, "load_api", lambda spec: api)
    tensors = materialize(case)
    p = shard.plan(engine.convention(case), case, engine.world)
    pieces = []
    for rank in range(engine.world):
        ctx = FakeContext(rank=rank, world=engine.world, device=torch.device("cpu"), group="WORLD")
        r = engine.run_rank(ctx, case, local_inputs(case, tensors, p, rank))
        pieces.append({n: getattr(r, n) for n in ("out", "dq", "dk", "dv") if getattr(r, n) is not None})
    return tensors, gather(case, p, pieces), r.ran


@pytest.mark.parametrize("case, mask, window", [
    (Case(sq=8, skv=8, causal=True), "causal", (-1, 0)),
    (Case(sq=8, skv=8, causal=True, window=(3, None)), "causal", (3, 0)),
    (Case(sq=8, skv=8, window=(None, 0)), "causal", (-1, 0)),
    (Case(sq=8, skv=8, window=(2, 5)), "no_mask", (2, 5)),
    (Case(sq=8, skv=12), "no_mask", (-1, -1)),
    (Case(b=2, sq=8, skv=8, seqlens_q=(5, 8), seqlens_kv=(5, 8), layout="thd", causal=True), "padding_causal",
     (-1, 0)),
])
def test_translate_spells_masks_and_windows_as_te_does(case, mask, window):
    call = translate(case, "fused", 2)
    assert (call.init["attn_mask_type"], call.init["window_size"]) == (mask, window)
    assert call.init["qkv_format"] == case.layout and call.init["num_gqa_groups"] == case.hk
    assert call.env == {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"}


def test_translate_thd_cu_seqlens_are_actual_and_padded_to_2cp():
    case = Case(b=3, sq=8, skv=8, seqlens_q=(5, 8, 1), seqlens_kv=(5, 8, 1), layout="thd")
    cu = translate(case, "flash", 2).cu_seqlens
    assert cu["cu_seqlens_q"] == [0, 5, 13, 14] and cu["cu_seqlens_q_padded"] == [0, 8, 16, 20]
    assert translate(case, "flash", 2).env["NVTE_FLASH_ATTN"] == "1"


@pytest.mark.parametrize("engine, case", [
    (TEEngine("p2p", "fused"), Case(b=2, sq=8, skv=8, h=2, d_qk=64, d_v=64, dtype="bfloat16", causal=True,
                                    grads=True, seed=1)),
    (TEEngine("all_gather", "fused"), Case(sq=8, skv=8, h=2, d_qk=64, d_v=64, dtype="float16", layout="sbhd",
                                           grads=True, seed=2)),
    (TEEngine("a2a", "flash"), Case(b=2, sq=8, skv=8, h=4, hk=2, d_qk=64, d_v=64, dtype="bfloat16",
                                    seqlens_q=(4, 8), seqlens_kv=(4, 8), layout="thd", grads=True, seed=3)),
    (TEEngine("a2a+p2p", "fused", 4), Case(b=2, sq=16, skv=16, h=4, hk=2, d_qk=64, d_v=64, dtype="bfloat16",
                                           seqlens_q=(3, 16), seqlens_kv=(3, 16), layout="thd", causal=True,
                                           grads=True, seed=4)),
])
def test_layouts_round_trip_through_shards_and_gather(engine, case, monkeypatch):
    api, calls = make_fake_api()
    before = {n: os.environ.get(n) for n in NVTE}
    tensors, out, ran = run_all_ranks(engine, case, api, monkeypatch)
    rows = torch.arange(case.sq)[None, :] < torch.tensor(case.lens_q)[:, None]
    assert torch.equal(out.out[rows], (2 * tensors.q)[rows])          # 2*q came back where q came from
    assert torch.equal(out.dq[rows], (2 * tensors.dout)[rows])        # d(2q)/dq applied to the gathered dout
    assert out.dk.shape == tensors.k.shape and not out.dk.any()
    assert {n: os.environ.get(n) for n in NVTE} == before              # the switches were put back
    want_env = translate(case, engine.kernel, engine.world).env
    assert all(c["env"] == want_env and c["reselect"] and c["contiguous"] for c in calls)
    assert len(calls) == engine.world and calls[0]["cp"][1:] == (list(range(engine.world)), "stream",
                                                                engine.comm_type)
    assert ran.startswith(f"TE fake-2.20.2 cp_comm_type={engine.comm_type} "
                          f"{'FusedAttention' if engine.kernel == 'fused' else 'FlashAttention'}")


def test_a2a_p2p_uses_a_2x2_grid_of_groups(monkeypatch):
    api, calls = make_fake_api()
    case = Case(sq=16, skv=16, h=4, hk=2, d_qk=64, d_v=64, dtype="bfloat16", seed=5)
    run_all_ranks(TEEngine("a2a+p2p", "fused", 4), case, api, monkeypatch)
    assert [c["cp"][0] for c in calls] == [["a2a[0, 1]", "p2p[0, 2]"], ["a2a[0, 1]", "p2p[1, 3]"],
                                           ["a2a[2, 3]", "p2p[0, 2]"], ["a2a[2, 3]", "p2p[1, 3]"]]
    assert all(c["shapes"][0][1] == 4 for c in calls)  # 16 tokens over 4 ranks


def test_learnable_sink_reaches_the_module(monkeypatch):
    api, calls = make_fake_api()
    case = Case(sq=8, skv=8, h=2, hk=2, d_qk=64, d_v=64, dtype="bfloat16", softmax="learnable", seed=6)
    tensors, _, _ = run_all_ranks(TEEngine("a2a", "fused"), case, api, monkeypatch)
    assert calls[0]["init"]["softmax_type"] == "learnable" and torch.equal(calls[0]["offset"], tensors.sink)


def test_a_kernel_other_than_the_forced_one_is_an_error(monkeypatch):
    api, _ = make_fake_api(selects="flash")
    case = Case(sq=8, skv=8, h=2, d_qk=64, d_v=64, dtype="bfloat16", seed=7)
    with pytest.raises(RuntimeError, match="forced FusedAttention but TE ran FlashAttention"):
        run_all_ranks(TEEngine("p2p", "fused"), case, api, monkeypatch)


def test_te_refusing_every_backend_is_unsupported_with_te_s_own_reason(monkeypatch, capsys):
    api, _ = make_fake_api(refuse=True)
    case = Case(sq=8, skv=8, h=2, d_qk=64, d_v=64, dtype="bfloat16", seed=8)
    logger = logging.getLogger("DotProductAttention")
    stderr_handler = logging.StreamHandler()  # TE's own handler: it must stay quiet
    logger.addHandler(stderr_handler)
    before = (logger.level, logger.propagate, stderr_handler.level, FakeAttentionLogging._log_level)
    try:
        with pytest.raises(Unsupported) as refused:
            run_all_ranks(TEEngine("p2p", "fused"), case, api, monkeypatch)
        after = (logger.level, logger.propagate, stderr_handler.level, FakeAttentionLogging._log_level)
    finally:
        logger.removeHandler(stderr_handler)
    assert str(refused.value) == ("TE fake-2.20.2: no backend for this case with fused forced: Disabling "
                                  "FusedAttention: planted reject message (a CP per-step config)")
    assert after == before and capsys.readouterr().err == ""  # levels put back, nothing printed


def test_without_te_s_logging_class_the_refusal_has_no_reasons(monkeypatch):
    api, _ = make_fake_api(refuse=True, logs=False)
    case = Case(sq=8, skv=8, h=2, d_qk=64, d_v=64, dtype="bfloat16", seed=8)
    with pytest.raises(Unsupported, match="^TE fake-2.20.2: no backend for this case with fused forced$"):
        run_all_ranks(TEEngine("p2p", "fused"), case, api, monkeypatch)


def test_table_off_lets_a_declared_refusal_reach_te(monkeypatch):
    api, calls = make_fake_api()
    case = Case(sq=4, skv=4, h=2, d_qk=64, d_v=64, dtype="bfloat16", seed=8)
    assert TEEngine("all_gather", "fused").unsupported(case) is not None
    assert TEEngine("all_gather", "fused", table=False).unsupported(case) is None
    run_all_ranks(TEEngine("all_gather", "fused", table=False), case, api, monkeypatch)
    assert len(calls) == 2


def test_unsupported_cases_never_reach_te(monkeypatch):
    api, calls = make_fake_api()
    case = Case(sq=8, skv=8, h=2, d_qk=64, d_v=64, dtype="bfloat16", window=(2, 2), seed=9)
    with pytest.raises(Unsupported, match="sliding window"):
        run_all_ranks(TEEngine("p2p", "fused"), case, api, monkeypatch)
    assert calls == []


def test_whole_run_is_the_same_module_without_cp(monkeypatch):
    api, calls = make_fake_api()
    monkeypatch.setattr(te_mod, "load_api", lambda spec: api)
    case = Case(b=2, sq=8, skv=8, h=2, d_qk=64, d_v=64, dtype="bfloat16", seqlens_q=(3, 8), seqlens_kv=(3, 8),
                layout="thd", seed=10)
    tensors = materialize(case)
    ctx = FakeContext(rank=0, world=2, device=torch.device("cpu"), group="WORLD")
    whole = TEEngine("p2p", "fused").run_whole(ctx, case, tensors)
    assert calls[0]["cp"] is None and whole.out.shape == (2, 8, 2, 64)
    assert torch.equal(whole.out[0, :3], 2 * tensors.q[0, :3]) and not whole.out[0, 3:].any()
