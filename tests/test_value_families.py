"""The value families (strategies/materialize.py): each holds what the docstring says, deterministically from the
seed; the oracle stays exact on far-negative rows; a kernel with a bug that only a family reaches is found by the
fuzz loop and shrunk to the family's plainest case; the same kernel without the bug never fails."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given

from attnfuzz.backends.custom import load_custom
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import Oracle, grade
from attnfuzz.oracles.reference import reference
from attnfuzz.strategies.case import FAMILIES, Case
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.materialize import (ANTI_LOGIT, OUTLIER, ROW_SHIFTS, SINK_SIZES, Tensors, family_channel,
                                             materialize, row_shift)
from attnfuzz.strategies.space import Space

BASE = Case(b=2, sq=24, skv=40, h=4, hk=2, d_qk=16, d_v=8, dtype="bfloat16", memory="transposed", grads=True)


def _unshifted(case: Case, t: Tensors) -> Tensors:
    q = t.q.clone()
    q[..., family_channel(case)] = 0
    return Tensors(**{**t.__dict__, "q": q})


@pytest.mark.parametrize("values", FAMILIES)
def test_a_family_is_deterministic_and_keeps_the_seeds_other_draws(values):
    case = BASE.replace(values=values, softmax="learnable", mask_density=0.5, seed=7)
    a, b, plain = materialize(case), materialize(case), materialize(case.replace(values="gaussian"))
    for name in ("q", "k", "v", "mask", "sink", "dout"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.q.stride() == plain.q.stride() and torch.isfinite(a.q).all() and torch.isfinite(a.v).all()
    assert torch.equal(a.mask, plain.mask) and torch.equal(a.dout, plain.dout)   # the rest of the stream is the seed's


def test_far_negative_rows_are_a_shift_of_the_unshifted_rows_and_the_oracle_keeps_them_exact():
    case = BASE.replace(values="far_negative", seed=5)
    t = materialize(case)
    c = family_channel(case)
    assert bool((t.k[..., c] == 1).all())
    shift = row_shift(case, t)
    targets = torch.tensor(ROW_SHIFTS, dtype=torch.float64)
    assert bool(((shift[..., None] - targets).abs().min(-1).values <= 2.0 ** -7 * targets.abs().max()).all())
    assert {round(x) for x in ROW_SHIFTS} <= {round(x) for x in shift.unique().tolist()}  # every shift is drawn
    ref, plain = reference(case, t), reference(case, _unshifted(case, t))
    assert torch.isfinite(ref.lse).all() and ref.lse.min() < -1000       # not -inf: logsumexp subtracts the maximum
    assert torch.allclose(ref.lse, plain.lse + shift, rtol=0, atol=1e-9)
    assert torch.allclose(ref.out, plain.out, rtol=0, atol=1e-12)
    assert bool(((ref.lse < -103.3) == (shift < -100)).all())             # past fp32's denormals exactly there


def test_anti_aligned_keys_sit_far_below_the_aligned_ones():
    case = BASE.replace(values="anti_aligned", seed=3)
    t = materialize(case)
    c = family_channel(case)
    a = t.q[0, 0, 0, c].item()
    assert bool((t.q[..., c] == a).all()) and abs(case.softmax_scale * a * a - ANTI_LOGIT) < 0.01 * ANTI_LOGIT
    assert set(t.k[..., c].unique().tolist()) <= {0.0, -a}
    found = {materialize(case.replace(seed=s)).k[..., c].eq(0).float().mean().item() for s in range(40)}
    assert 0.0 in found and any(0 < f <= 0.25 for f in found)            # no aligned key, and a few


def test_outlier_channel_large_sink_ties_and_zero_rows_hold_their_patterns():
    out = materialize(BASE.replace(values="outlier_channel"))
    c = family_channel(BASE)
    assert bool((out.q[..., c].abs() == OUTLIER).all()) and bool((out.k[..., c].abs() == OUTLIER).all())
    sink = materialize(BASE.replace(values="large_sink", softmax="learnable", seed=2)).sink
    assert set(sink.abs().tolist()) <= set(SINK_SIZES)
    ties = materialize(BASE.replace(values="ties", seed=4))
    for x in (ties.q, ties.k):
        assert bool((x == x.round()).all()) and x.abs().max() <= 2
    k = ties.k.float()
    assert any(torch.equal(k[:, : k.shape[1] - m], k[:, m:]) for m in range(1, 5))   # keys repeat with a period <= 4
    zero = materialize(BASE.replace(values="zero_rows", seed=6))
    zq = (zero.q == 0).flatten(2).all(-1)
    zk = (zero.k == 0).flatten(2).all(-1)
    assert zq.any() and not zq.all() and zk.any() and not zk.all()
    assert bool((zero.v.flatten(2)[zk] == 0).all())


def test_a_plain_run_draws_every_family_and_the_switch_turns_them_off():
    seen: Counter = Counter()

    @profile("ci", max_examples=600)
    @given(case=attention_cases(Space()))
    def draw(case):
        seen[case.values] += 1

    draw()
    assert set(FAMILIES) <= set(seen), seen
    seen.clear()

    @profile("ci", max_examples=200)
    @given(case=attention_cases(Space(value_families=False)))
    def off(case):
        seen[case.values] += 1

    off()
    assert set(seen) <= {"gaussian", "probe"}, seen


def test_an_lse_that_lost_the_shift_or_an_output_that_moved_fails_saying_so():
    case = Case(sq=6, skv=9, h=2, hk=2, d_qk=16, d_v=16, dtype="float32", values="far_negative", seed=11)
    t = materialize(case)
    o = Oracle.of(case, t)
    shift = row_shift(case, t)
    good = V.Output(o.ref.out.float(), lse=o.ref.lse.float())
    assert grade(case, t, good, oracle=o).status == V.PASS
    lost = grade(case, t, V.Output(o.ref.out.float(), lse=(o.ref.lse - shift).float()), oracle=o)
    assert lost.label == "FAIL:LSE" and "lost the rows' logit shift" in lost.message, lost.message
    moved = reference(case, _unshifted(case, t)).out.clone()
    b, i, h = [int(x) for x in torch.nonzero(shift.transpose(1, 2) < -100)[0]]
    moved[b, i, h] = t.v[b, :, h // (case.h // case.hk)].double().mean(0)  # a far-negative row: the mean of v
    failed = grade(case, t, V.Output(moved.float(), lse=o.ref.lse.float()), oracle=o)
    assert failed.failed and "shift invariant" in failed.message and "past -103.28" in failed.message, failed


# kernel in tests/value_kernels.py -> the families its bug shows in, the label it must be found under
PLANTED = {
    # every row whose logits all sit far below 0 underflows: far-negative rows and rows of anti-aligned keys
    "max_from_zero": (("far_negative", "anti_aligned"), {"FAIL:NONFINITE", "FAIL:LSE"}),
    # every family with rows of logits below -80 reaches it; a one-key row can match another scale by chance
    "clamp_logits": (("far_negative", "anti_aligned", "outlier_channel", "large_sink"),
                     {"FAIL:TOLERANCE", "FAIL:LSE", "FAIL:SCALE"}),
    "max_from_finite": (("anti_aligned",), {"FAIL:NONFINITE"}),
    # products past fp16's 65504: the outlier channel (256 x 256) and anti-aligned keys (logits ~2^14) both reach it
    "fp16_logits": (("outlier_channel", "anti_aligned"), {"FAIL:NONFINITE"}),
    "drop_huge_sinks": (("large_sink",), {"FAIL:TOLERANCE", "FAIL:SCALE", "FAIL:LSE"}),
    "dedup_keys": (("ties",), {"FAIL:TOLERANCE"}),
    "zero_keys_as_padding": (("zero_rows",), {"FAIL:TOLERANCE", "FAIL:LSE"}),
}
# storage off: its draws would move this derandomized stream, and these kernels' bugs are in the values, not the
# buffers (tests/test_storage.py runs its planted kernels on the default space)
SPACE = Space(max_len=80, storages=("plain",))
SETTINGS = profile("ci", max_examples=1000)  # each family is one case in 30


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_bug_only_a_family_reaches_is_found_and_shrunk_to_its_plainest_case(name):
    families, labels = PLANTED[name]
    # one-wide fp16 keys repeat among a few dozen Gaussian draws, where dedup_keys is wrong without any family
    # (found so: sq = skv = 78, d = 1): from 8 columns up a repeat takes a family
    space = SPACE.replace(head_dims=(8, 16, 32, 64)) if name == "dedup_keys" else SPACE
    tally, findings = fuzz(load_custom(f"tests.value_kernels:{name}", "cpu"), space=space, settings=SETTINGS)
    assert findings, f"{name}: nothing found in {tally.to_dict()}"
    # families overlap (a large sink pulls rows far below zero, an anti-aligned key with d = 1 is a zero key, a row
    # shift of -1024 needs fp32 logits): every finding is in some family, never on plain or probe values, and one at
    # least in the family the bug was planted for
    # (fp16 logits also lose a wide head's Gaussian logits under a custom scale of 1: that kernel is not family-only)
    assert name == "fp16_logits" or all(f.case.values in FAMILIES for f in findings), \
        [(f.verdict.label, f.case) for f in findings]
    assert any(f.case.values in families and f.verdict.label in labels for f in findings), \
        [(f.verdict.label, f.case) for f in findings]
    smallest = min(findings, key=lambda f: (f.case.sq + f.case.skv, f.case.b)).case   # of equal lengths, fewest b
    assert smallest.b <= 2 and smallest.sq <= 3 and smallest.skv <= 3, smallest


def test_the_same_kernel_without_the_bug_never_fails():
    tally, findings = fuzz(load_custom("tests.value_kernels:correct", "cpu"), space=SPACE, settings=SETTINGS)
    assert not findings, [f"{f.verdict.label} {f.verdict.message[:300]} {f.case!r}" for f in findings]
    assert tally.labels["PASS"] >= 0.9 * SETTINGS.max_examples, tally.to_dict()
