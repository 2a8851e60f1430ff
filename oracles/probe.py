"""Exact checks on probe cases (strategies/case.py, values="probe"), which do not depend on rounding.

q = 0 makes every logit exactly 0 in any precision, so each visible key of a row gets the same weight
w = 1 / (count + exp(sink)), and v holds 0 and 1 (channel c: the keys in residue class c). A row's output in channel
c is then count_c * w: a sum of equal positive terms, which no rounding can cancel, so a correct kernel is off by at
most a relative R = eps(dtype) (w rounded to the dtype before P V, and the result rounded to it: half an ulp each)
+ (count + 4) * eps(fp32) (the fp32 sum of count_c equal terms and w's own rounding, with a factor 2 to spare).
Where count_c = 0 the output is exactly 0 in every dtype. One key more or less moves channel c by ~w, i.e. by
1 / count_c relative, so a leaked or dropped key on any row is caught wherever count_c < 1 / R (count < d_v / R):
in bf16 (R ~ 2^-7) rows of up to ~128 * d_v keys, in fp16 ~1000 * d_v, in fp32 every length.
The LSE is log(count + exp(sink)) to fp32 rounding (a sum of exact ones, a log and the sink's exp): off by at most
4 * eps(fp32) * max(|lse|, 1) in a correct kernel, plus the fast-exp allowance for fp16 / bf16 (tolerance.FAST_EXP);
one key more or less moves it by ~1 / count.
ALiBi makes the weights differ, so a probe case with ALiBi gets the ordinary per-row bounds only.
"""

from __future__ import annotations

import math

import torch

from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.alternatives import alternatives, fail, valid_rows
from attnfuzz.oracles.reference import reference
from attnfuzz.oracles.tolerance import EPS, FAST_EXP, LOW_PRECISION, Check

LSE_ULPS = 4.0  # the fp32 log of an exact count, the add of the max logit (0) and exp(sink): 2 ulp, twice


def applies(case) -> bool:
    return case.values == "probe" and case.alibi_slopes is None


def _counts(o) -> torch.Tensor:
    """[b, h, sq]: count + exp(sink) of each row, read from the float64 LSE (exp(-inf) = 0 for empty rows)."""
    return torch.exp(o.ref.lse)


def out_check(o, out: torch.Tensor, ref_out: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> Check:
    """Each valid row's output (each of `rows` [b, sq] where given), element by element, within R * expected
    (exactly 0 where expected is 0)."""
    ref = (o.ref.out if ref_out is None else ref_out).to(torch.float64)
    got = out.to(ref.device, torch.float64)
    logit_eps = EPS["float64"] if o.case.dtype == "float64" else EPS["float32"]
    rel = EPS[o.case.dtype] + (_counts(o).transpose(1, 2)[..., None] + 4) * logit_eps   # [b, sq, h, 1]
    bound = rel * ref.abs()
    diff = (got - ref).abs().nan_to_num(nan=math.inf)
    where = (valid_rows(o.case, ref.device) if rows is None else rows)[:, :, None, None].expand_as(diff)
    ratio = torch.where(bound > 0, diff / bound, torch.where(diff > 0, math.inf, 0.0))
    ratio = torch.where(where, ratio, -1.0)
    if not bool(where.any()):   # no row is graded (every query of the batch is padding): nothing to read
        return Check("out (probe)", 0.0, 0.0, 0.0, 0.0, (), 0.0, 0.0, 0)
    flat = int(torch.argmax(ratio).item())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), ratio.shape))
    return Check("out (probe)", diff[index].item(), 0.0, 0.0, bound[index].item(), index, got[index].item(),
                 ref[index].item(), int(where[..., 0].sum().item()))


def grade_out(o, out: torch.Tensor, checks: list, rows: torch.Tensor | None = None) -> V.Verdict | None:
    """None when the probe's output is exact to rounding; else a FAIL named by the alternative reference it
    matches on `rows` (the valid rows unless given: an alignment, a window bound moved by one, the modulo head
    mapping), else by `_named`."""
    c = out_check(o, out)
    checks.append(c)
    if c.ok:
        return None
    b, i, h, ch = c.index
    count = _counts(o)[b, h, i].item()
    where = (f"row {[b, i, h]} channel {ch} reads {c.got:.6g} where it must be {c.expected:.6g} (the share of its "
             f"{count:.6g} visible keys in residue class {ch}) to within {c.floor:.3g}")
    for diagnosis, description, overrides in alternatives(o.case):
        alt_case = overrides.pop("case", o.case)
        alt = reference(alt_case, o.tensors, device=o.ref.out.device, grads=False, terms=False, **overrides)
        if out_check(o, out, alt.out, rows).ok:
            return fail(diagnosis, f"probe: {description}; {where}", c, c.ratio, [x.describe() for x in checks])
    return _named(o, out, c, where, checks)


# A row that counted whole keys too many or too few reads, in every channel, an integer count over the row's new
# total: got_c * (count + m) is an integer for the m keys it gained (m < 0: lost), the integers sum to the row's key
# count + m and differ from the row's own counts. A quarter of a key is far beyond the rounding of a short row
# (R * count_c < 0.25 while count_c < 0.25 / R: bf16 rows of up to ~64 keys per channel) and far from any whole-key
# error; on longer rows the rounding cannot tell, and the sign rule stays.
WHOLE_KEY = 0.25
KEYS_MOVED = range(-4, 5)


def _whole_keys(row: torch.Tensor, expected: torch.Tensor, count: float, rel: float) -> bool | None:
    """True when the row reads as whole keys counted too many or too few (over count + m for a small m), False when
    it cannot, None when the row is too long for its rounding to tell."""
    row, expected = row.to(torch.float64), expected.to(torch.float64)
    if rel * float(row.abs().max()) * count > WHOLE_KEY:
        return None
    own = (expected * count).round()
    for m in KEYS_MOVED:
        keys = row * (count + m)
        whole = keys.round()
        if (count + m > 0 and float((keys - whole).abs().max()) <= WHOLE_KEY
                and float(whole.sum() - own.sum()) == m and not bool(torch.equal(whole, own))):
            return True
    return False


def _named(o, out: torch.Tensor, c: Check, where: str, checks) -> V.Verdict:
    """MASK_LEAK (a channel reads more than its share: a key the row must not see was counted) or MASK_DROP (less: a
    visible key was lost) when the row reads as whole keys counted too many or too few; TOLERANCE when it cannot
    (a fraction of a key: weights or precision, not a mask), or when the whole row reads 0 (never written, or every
    key lost: a mask cannot tell them apart)."""
    described = [x.describe() for x in checks]
    b, i, h, _ = c.index
    row = out[b, i, h].to(torch.float64)
    count = _counts(o)[b, h, i].item()
    if not bool(row.any()):
        return fail(V.TOLERANCE, f"probe: the row reads 0 in every channel where it sees {count:.6g} keys (not "
                                 f"written, or every key lost): {where}", c, c.ratio, described)
    rel = EPS[o.case.dtype] + (count + 4) * EPS["float32"]
    if _whole_keys(row, o.ref.out[b, i, h], count, rel) is False:
        off = (c.got - c.expected) * count
        return fail(V.TOLERANCE, f"probe: the row is off by {off:+.3g} of one key's weight, not by whole keys (a "
                                 f"weighting or precision error, not a mask): {where}", c, c.ratio, described)
    if c.got > c.expected:
        return fail(V.MASK_LEAK, f"probe: a key the row must not see was counted: {where}", c, c.ratio, described)
    return fail(V.MASK_DROP, f"probe: a key the row sees was dropped: {where}", c, c.ratio, described)


def name_failure(o, out: torch.Tensor, failed: Check) -> V.Verdict:
    """A probe output that failed the per-row bound and matches no alternative, named by `_named`, with the per-row
    check that failed it."""
    c = out_check(o, out)
    b, i, h, ch = c.index
    where = (f"row {[b, i, h]} channel {ch} reads {c.got:.6g} where its share of visible keys is {c.expected:.6g}; "
             f"{failed.describe()}")
    return _named(o, out, c, where, [failed])


def grade_lse(o, lse: torch.Tensor, checks: list) -> V.Verdict | None:
    """None when every finite row's LSE is log(count + exp(sink)) to fp32 rounding; else FAIL:LSE saying how many
    keys the LSE counted."""
    ref = o.ref.lse
    got = lse.to(ref.device, torch.float64)
    rows = valid_rows(o.case, ref.device)[:, None, :].expand_as(ref) & torch.isfinite(ref)
    # torch's CPU flash kernel on fp16 / bf16 read 63.9966 keys for 64 (5.3e-5 off): its fast exp / log path errs
    # even on a sum of exp(0), so those dtypes keep the fast-exp allowance (a key of 4096 still moves it 2x that)
    fast = FAST_EXP if o.case.dtype in LOW_PRECISION else 0.0
    bound = LSE_ULPS * EPS["float32"] * ref.abs().clamp(min=1.0) + fast
    diff = (got - ref).abs().nan_to_num(nan=math.inf)
    ratio = torch.where(rows, diff / bound, -1.0)
    if not bool(rows.any()):   # no finite graded row: nothing to read
        return None
    flat = int(torch.argmax(ratio).item())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), ratio.shape))
    c = Check("lse (probe)", diff[index].item(), 0.0, 0.0, bound[index].item(), index, got[index].item(),
              ref[index].item(), int(rows.sum().item()))
    checks.append(c)
    if c.ok:
        return None
    said, sees = math.exp(c.got) if c.got < 700 else math.inf, math.exp(c.expected)
    return fail(V.LSE, f"probe: the LSE of row {list(index)} counts exp(lse) = {said:.6g} keys (with the sink) where "
                        f"the row sees {sees:.6g}: {c.describe()}", c, c.ratio, [x.describe() for x in checks])
