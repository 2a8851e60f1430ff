"""Space.top_left_shift: a kernel that aligns bands bottom-right (flash-attn, FlashInfer) refuses a top-left band
whose shift needs a negative bound; its space draws such cases bottom-right instead of spending them on refusals."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, seed, settings

from attnfuzz.backends import get
from attnfuzz.backends.flash import common as fc
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.space import Space, narrow_to, top_left_shift_refused


def _drawn(space: Space, n: int = 600) -> list[Case]:
    cases: list[Case] = []

    @seed(0)
    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(attention_cases(space))
    def collect(case):
        cases.append(case)

    collect()
    return cases


def _fa_refuses(case: Case) -> bool:
    return fc.bottom_right_band(case)[0] is None or fc.alibi_reason(case) is not None


def test_the_rule_is_flash_attns_own():
    cases = [c for c in _drawn(Space(max_len=160)) if c.alignment == "top_left"]
    assert sum(map(_fa_refuses, cases)) >= 20
    assert all(top_left_shift_refused(c) == _fa_refuses(c) for c in cases)


def test_bottom_right_kernels_narrow_it_off_and_draw_none_they_refuse():
    for name in ("fa2", "fa4", "flashinfer-ragged"):
        assert not narrow_to(Space(), get(name, "cuda").unsupported).top_left_shift, name
    assert narrow_to(Space(), get("sdpa-math", "cpu").unsupported).top_left_shift
    narrowed = Space(max_len=160, top_left_shift=False)
    assert not any(_fa_refuses(c) for c in _drawn(narrowed))
    assert any(_fa_refuses(c) for c in _drawn(Space(max_len=160)))      # the negative control


def test_a_band_that_shifts_with_a_positive_bound_stays_top_left():
    """Top-left causal with sq > skv moves to a bottom-right right bound of sq - skv >= 0: still drawn (the
    flash-attn 2 clamp of such bounds, Dao-AILab/flash-attention#895, lives there)."""
    case = Case(sq=6, skv=3, causal=True)
    assert not top_left_shift_refused(case) and not _fa_refuses(case)
    assert top_left_shift_refused(Case(sq=3, skv=6, causal=True))
