"""Sharding conventions are permutations with exact inverses, and match the layouts TE and torch document."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from attnfuzz.backends.cp import shard
from attnfuzz.backends.cp.pool import gather
from attnfuzz.strategies.case import Case


def _lists(parts):
    return [p.tolist() for p in parts]


def test_head_tail_matches_te_docstring_example():
    # attn_forward_func_with_cp's example: s = 12, cp = 2 -> GPU0 holds 0 1 2 9 10 11, GPU1 holds 3 .. 8
    assert _lists(shard.head_tail(12, 2)) == [[0, 1, 2, 9, 10, 11], [3, 4, 5, 6, 7, 8]]


def test_dual_chunk_matches_te_thd_example():
    # thd example: seq lens [8, 4], cp = 2 -> GPU0 seq0 pos 0 1 6 7, seq1 pos 0 3; GPU1 the rest
    assert _lists(shard.dual_chunk((8, 4), 2)) == [[0, 1, 6, 7, 8, 11], [2, 3, 4, 5, 9, 10]]


def test_contiguous_is_plain_blocks():
    assert _lists(shard.contiguous(8, 4)) == [[0, 1], [2, 3], [4, 5], [6, 7]]


@given(world=st.sampled_from([1, 2, 4]), chunks=st.integers(1, 6))
def test_every_convention_is_a_permutation(world, chunks):
    n = 2 * world * chunks
    for parts in (shard.contiguous(n, world), shard.head_tail(n, world), shard.dual_chunk((n,), world)):
        assert len(parts) == world and shard.is_permutation(parts, n)
    assert _lists(shard.dual_chunk((n,), world)) == _lists(shard.head_tail(n, world))


@given(world=st.sampled_from([2, 4]), lens=st.lists(st.integers(0, 4), min_size=1, max_size=4))
def test_dual_chunk_over_packed_sequences_is_a_permutation(world, lens):
    lens = tuple(2 * world * n for n in lens)
    parts = shard.dual_chunk(lens, world)
    assert shard.is_permutation(parts, sum(lens))
    assert all(p.numel() == sum(lens) // world for p in parts)


def test_is_permutation_rejects_duplicates_and_gaps():
    assert not shard.is_permutation([torch.tensor([0, 1]), torch.tensor([1, 2])], 4)
    assert not shard.is_permutation([torch.tensor([0, 1]), torch.tensor([3])], 4)


@given(world=st.sampled_from([2, 4]), chunks=st.integers(1, 3), dim=st.integers(0, 2),
       convention=st.sampled_from(["contiguous", "head_tail"]))
def test_unshard_inverts_shard(world, chunks, dim, convention):
    n = 2 * world * chunks
    shape = [3, 3, 3]
    shape[dim] = n
    x = torch.randn(shape)
    parts = getattr(shard, convention)(n, world)
    pieces = shard.shard(x, parts, dim)
    assert torch.equal(shard.unshard(pieces, parts, dim), x)
    if world > 1:  # the inverse really depends on the convention: the wrong one scrambles the axis
        other = shard.contiguous(n, world) if convention == "head_tail" else shard.head_tail(n, world)
        assert not torch.equal(shard.unshard(pieces, other, dim), x)


@pytest.mark.parametrize("call, words", [
    (lambda: shard.contiguous(6, 4), ["n=6", "world=4"]),
    (lambda: shard.head_tail(6, 2), ["n=6", "2*world=4"]),
    (lambda: shard.dual_chunk((8, 6), 2), ["(8, 6)", "2*world=4"]),
    (lambda: shard.plan("zigzag", Case(), 2), ["convention='zigzag'"]),
    (lambda: shard.unshard([torch.zeros(2)], [torch.arange(2), torch.arange(2)], 0), ["1 pieces for 2 ranks"]),
])
def test_bad_input_names_the_input(call, words):
    with pytest.raises(ValueError) as e:
        call()
    assert all(w in str(e.value) for w in words), str(e.value)


def test_pack_padded_round_trip_and_lse_axis():
    x = torch.randn(2, 6, 3, 4)
    lens, pads = (5, 2), (8, 4)
    packed = shard.pack_padded(x, lens, pads)
    assert packed.shape == (12, 3, 4)
    assert torch.equal(packed[5:8], torch.zeros(3, 3, 4))  # zero padding after sequence 0
    back = shard.unpack_padded(packed, lens, pads, 6)
    for n, length in enumerate(lens):
        assert torch.equal(back[n, :length], x[n, :length]) and not back[n, length:].any()
    lse = torch.randn(3, 12)  # [heads, t]
    out = shard.unpack_padded(lse, lens, pads, 6, dim=1, fill=float("-inf"))
    assert out.shape == (2, 3, 6)
    assert torch.equal(out[1, :, :2], lse[:, 8:10]) and torch.isinf(out[1, :, 2:]).all()


def _pieces(case, p, full):
    """What each rank would return: its shard of the logical out / lse."""
    out, lse = full
    pieces = []
    for r in range(p.world):
        if p.packed:
            o = shard.pack_padded(out, case.lens_q, p.padded_q)[p.q_parts[r]]
            lp = shard.pack_padded(lse.transpose(1, 2), case.lens_q, p.padded_q).transpose(0, 1)[:, p.q_parts[r]]
        else:
            o, lp = out[:, p.q_parts[r]], lse[:, :, p.q_parts[r]]
        pieces.append({"out": o, "lse": lp})
    return pieces


@settings(max_examples=40)
@given(world=st.sampled_from([2, 4]), b=st.integers(1, 3), data=st.data())
def test_gather_puts_every_rank_piece_back(world, b, data):
    thd = data.draw(st.booleans())
    s = 2 * world * data.draw(st.integers(1, 3))
    if thd:
        lens = tuple(data.draw(st.integers(0, s)) for _ in range(b))
        case = Case(b=b, sq=s, skv=s, h=2, seqlens_q=lens, seqlens_kv=lens, layout="thd")
        p = shard.plan("dual_chunk", case, world)
    else:
        case = Case(b=b, sq=s, skv=s, h=2)
        p = shard.plan(data.draw(st.sampled_from(shard.CONVENTIONS)), case, world)
    out = torch.randn(b, s, 2, 16)
    lse = torch.randn(b, 2, s)
    got = gather(case, p, _pieces(case, p, (out, lse)))
    for n, length in enumerate(case.lens_q):
        assert torch.equal(got.out[n, :length], out[n, :length])
        assert torch.equal(got.lse[n, :, :length], lse[n, :, :length])
    assert got.dq is None  # not returned by every rank, so not gathered
