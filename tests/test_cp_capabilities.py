"""The CP capability table and cp_cases: every drawn case is one the engine takes (constrained, not filtered),
the draws reach the features each engine supports, and every refusal says why."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.errors import InvalidArgument

from attnfuzz.backends.cp.capabilities import (LSE_ALIGN, TE_COMM_TYPES, TE_KERNELS, ring_lse_align, ring_lse_padding_defect,
                                   ring_refusal, te_refusal)
from attnfuzz.backends.cp.cases import cp_cases
from attnfuzz.backends.cp.ring import RingEngine
from attnfuzz.backends.cp.te import TEEngine
from attnfuzz.strategies.case import Case

ENGINES = [RingEngine("allgather"), RingEngine("alltoall"), RingEngine("allgather", 4),
           RingEngine("alltoall", 2, "cuda")] + [TEEngine(c, k, w) for c, w in TE_COMM_TYPES.items()
                                                  for k in TE_KERNELS if (c, k) != ("a2a+p2p", "flash")]


@pytest.mark.parametrize("engine", ENGINES, ids=repr)
def test_every_drawn_case_is_supported(engine):
    drawn: list[Case] = []

    @settings(max_examples=150, deadline=None, database=None)
    @given(case=cp_cases(engine))
    def check(case):
        assert engine.unsupported(case) is None, f"{engine.unsupported(case)}\n{case!r}"
        drawn.append(case)

    check()
    # the draws reach what each engine supports, and nothing else
    assert {c.causal for c in drawn} == {True, False} and any(c.grads for c in drawn)
    if isinstance(engine, TEEngine):
        windows = any(c.window != (None, None) for c in drawn)
        assert windows == (engine.comm_type in ("a2a", "all_gather"))
        sinks = any(c.softmax != "vanilla" for c in drawn)
        assert sinks == ((engine.comm_type, engine.kernel) == ("a2a", "fused"))
        assert any(c.layout == "thd" for c in drawn)
        assert ("sbhd" in {c.layout for c in drawn}) == (engine.kernel == "fused")
    else:
        assert any(c.h != c.hk for c in drawn) and {c.spelling for c in drawn} >= {"", "contiguous"}
        assert ("float64" in {c.dtype for c in drawn}) == (engine.device == "cpu")


@pytest.mark.parametrize("case, words", [
    (Case(sq=8, skv=8, spelling="head_tail"), "Load balancing requires"),
    (Case(sq=6, skv=6, causal=True), "multiples of 4"),
    (Case(sq=8, skv=12, causal=True), "same query and context sequence lengths"),
    (Case(sq=8, skv=8, seqlens_q=(4,), seqlens_kv=(8,)), "padded sequences"),
    (Case(sq=8, skv=8, d_v=8), "same head size"),
    (Case(sq=8, skv=8, softmax="learnable"), "sink"),
    (Case(sq=8, skv=8, softcap=5.0), "softcap"),
])
def test_ring_refusals_say_why(case, words):
    assert words in (ring_refusal(case, 2) or ""), ring_refusal(case, 2)


TE_CASE = Case(sq=8, skv=8, h=4, hk=2, d_qk=64, d_v=64, dtype="bfloat16")


@pytest.mark.parametrize("comm, kernel, world, changes, words", [
    ("p2p", "fused", 2, {"window": (2, 2)}, "sliding window attention with cp_comm_type=p2p"),
    ("a2a+p2p", "fused", 4, {"sq": 16, "skv": 16, "causal": True, "window": (4, None)}, "sliding window"),
    ("a2a", "fused", 2, {"h": 3, "hk": 1}, "h=3 and hk=1 must be multiples of 2"),
    ("a2a", "flash", 2, {"softmax": "off_by_one"}, "needs cp_comm_type='a2a' and FusedAttention"),
    ("all_gather", "fused", 2, {"softmax": "learnable"}, "needs cp_comm_type='a2a'"),
    ("a2a+p2p", "flash", 4, {"sq": 16, "skv": 16}, "disables FlashAttention 4"),
    ("p2p", "flash", 2, {"layout": "sbhd"}, "qkv_format = sbhd"),
    ("p2p", "fused", 2, {"sq": 6, "skv": 6}, "multiples of 2*cp=4"),
    ("p2p", "fused", 2, {"dtype": "float32"}, "fp16/bf16 only"),
    ("p2p", "fused", 2, {"skv": 12, "causal": True}, "causal masking for cross-attention"),
    ("p2p", "fused", 2, {"seqlens_q": (5,), "seqlens_kv": (5,)}, "no padding mask"),
    ("a2a", "fused", 2, {"window": (None, 3)}, "half-open band"),
    ("p2p", "fused", 4, {}, "p2p runs on 2 ranks"),
    ("p2p", "fused", 2, {"alibi_slopes": (0.5,) * 4}, "ALiBi"),
    ("a2a", "fused", 2, {"softmax": "learnable", "layout": "thd", "seqlens_q": (8,), "seqlens_kv": (8,)},
     "cuDNN < 9.18 (utils.py); cuDNN here is unknown"),
    ("all_gather", "fused", 2, {"sq": 4, "skv": 4}, "one query and one key row per chunk"),
    ("all_gather", "fused", 2, {"sq": 4, "skv": 4, "layout": "sbhd", "causal": True}, "one query and one key row"),
])
def test_te_refusals_say_why(comm, kernel, world, changes, words):
    reason = te_refusal(TE_CASE.replace(**changes), comm, kernel, world)
    assert reason is not None and words in reason, reason


def test_te_table_accepts_what_te_documents():
    thd_sink = TE_CASE.replace(softmax="learnable", layout="thd", seqlens_q=(8,), seqlens_kv=(8,))
    assert te_refusal(thd_sink, "a2a", "fused", 2, cudnn=91800) is None          # cuDNN 9.18 takes it
    assert "cuDNN here is 9.13.0" in te_refusal(thd_sink, "a2a", "fused", 2, cudnn=91300)
    assert te_refusal(TE_CASE.replace(sq=4, skv=8), "all_gather", "fused", 2) is None   # ran on the H200
    assert te_refusal(TE_CASE.replace(sq=4, skv=4), "all_gather", "flash", 2) is None
    assert te_refusal(TE_CASE.replace(sq=4, skv=4, layout="thd", seqlens_q=(3,), seqlens_kv=(3,)),
                      "all_gather", "fused", 2) is None
    assert te_refusal(TE_CASE.replace(causal=True), "p2p", "flash", 2) is None
    # TE 2.20.2 disables only FA2 for padding between thd sequences; FA4 takes it through seqused_q / seqused_k
    assert te_refusal(TE_CASE.replace(seqlens_q=(5,), seqlens_kv=(5,), layout="thd"), "p2p", "flash", 2) is None
    assert te_refusal(TE_CASE.replace(causal=True, window=(3, None)), "all_gather", "fused", 2) is None
    assert te_refusal(TE_CASE.replace(softmax="learnable"), "a2a", "fused", 2) is None
    assert te_refusal(TE_CASE.replace(sq=16, skv=16), "a2a+p2p", "fused", 4) is None


@pytest.mark.parametrize("case, world, align, defect", [
    (Case(sq=2, skv=2), 2, LSE_ALIGN, True),                       # the GPU crash: 1 row per rank
    (Case(sq=64, skv=64), 2, LSE_ALIGN, False),                    # 32 rows per rank
    (Case(sq=64, skv=64, causal=True), 2, LSE_ALIGN, True),        # load-balanced: the partial step takes 16 rows
    (Case(sq=64, skv=64, causal=True, spelling="contiguous"), 2, LSE_ALIGN, False),
    (Case(sq=128, skv=128, causal=True), 2, LSE_ALIGN, False),
    (Case(sq=2, skv=2), 2, 1, False),                              # ops with an unpadded LSE
])
def test_ring_lse_padding_defect_boundaries(case, world, align, defect):
    assert ring_lse_padding_defect(case, world, align) == defect


def test_ring_lse_align_is_the_cuda_efficient_op_only():
    assert ring_lse_align("cuda", "float32") == LSE_ALIGN
    assert {ring_lse_align("cuda", "bfloat16"), ring_lse_align("cuda", "float16"), ring_lse_align("cpu", "float32")} \
        == {1}


def test_fp32_ring_on_cuda_is_drawn_clear_of_the_lse_padding_defect_and_long_lengths_are_reached():
    engine = RingEngine("allgather", 2, "cuda")
    drawn: list[Case] = []

    @settings(max_examples=150, deadline=None, database=None)
    @given(case=cp_cases(engine))
    def check(case):
        assert not ring_lse_padding_defect(case, 2, ring_lse_align("cuda", case.dtype)), case
        drawn.append(case)

    check()
    fp32 = [c for c in drawn if c.dtype == "float32"]
    assert fp32 and {c.causal for c in fp32} == {True, False} and min(c.sq for c in fp32) == 64
    assert any(c.sq >= 128 for c in drawn if c.dtype != "float32")  # long_units: a 128-token tile and more


def test_te_draws_avoid_declared_refusals_and_reach_thd_sinks_with_new_cudnn():
    drawn: list[Case] = []

    @settings(max_examples=200, deadline=None, database=None)
    @given(case=cp_cases(TEEngine("a2a", "fused", cudnn=91800)))
    def check(case):
        assert te_refusal(case, "a2a", "fused", 2, cudnn=91800) is None
        drawn.append(case)

    check()
    assert any(c.layout == "thd" and c.softmax != "vanilla" for c in drawn)


@pytest.mark.parametrize("kwargs, words", [
    ({"long_units": [32]}, "long_units=\\[32\\]"),
    ({"long_units": (0,)}, "long_units=(0,)"),
    ({"dtypes": ("float64",)}, "dtypes=('float64',)"),
    ({"dtypes": ()}, "dtypes=()"),
    ({"max_units": 0}, "max_units=0"),
    ({"grads": "yes"}, "grads='yes'"),
])
def test_cp_cases_validates_its_arguments(kwargs, words):
    with pytest.raises(InvalidArgument, match=words.replace("(", r"\(").replace(")", r"\)")):
        cp_cases(TEEngine("p2p", "fused"), **kwargs)


def test_cp_cases_rejects_unknown_engines_and_engines_that_take_nothing():
    with pytest.raises(InvalidArgument, match="engine="):
        cp_cases(object())
    with pytest.raises(InvalidArgument, match="te-cp-a2a.p2p-flash: takes no case: TE disables FlashAttention 4"):
        cp_cases(TEEngine("a2a+p2p", "flash", 4))


@given(st.data())
def test_a2a_draws_heads_in_units_of_the_a2a_group(data):
    case = data.draw(cp_cases(TEEngine("a2a+p2p", "fused", 4)))
    assert case.h % 2 == 0 and case.hk % 2 == 0 and case.sq % 8 == 0
