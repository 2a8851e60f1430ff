"""Space.max_bytes bounds the device memory a drawn case holds (attnfuzz.strategies.lengths.device_bytes), the way
a campaign lane's share of the GPU needs; unset, the draw is what it was."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.lengths import FIXED_BYTES, device_bytes, head_bytes
from attnfuzz.strategies.space import Space

GPU = Space.for_device("cuda")
SHARE = 2 * 2**30


def _drawn(space: Space, n: int) -> list:
    cases = []

    @settings(max_examples=n, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(attention_cases(space.replace(long_one_in=2)))
    def collect(case):
        cases.append(case)

    collect()
    return cases


def _fits_at_all(case) -> bool:
    """Whether one sequence and one head at the narrowest head dims fit the share (else the draw cannot help it)."""
    return head_bytes(case.sq, case.skv, 1, 1) + FIXED_BYTES <= SHARE


def test_cases_stay_within_the_share_where_any_case_of_their_lengths_could():
    cases = _drawn(GPU.replace(max_bytes=SHARE), 400)
    over = [c for c in cases if device_bytes(c) > SHARE and _fits_at_all(c)]
    assert not over, [(c.b, c.h, c.sq, c.skv, c.d_qk, c.d_v, device_bytes(c)) for c in over[:3]]
    assert sum(max(c.sq, c.skv) > 4096 for c in cases) >= 20   # long cases are still drawn, with fewer heads


def test_without_a_share_the_same_search_draws_larger_cases():
    """The control: the bound above is not met by accident."""
    assert any(device_bytes(c) > SHARE for c in _drawn(GPU, 400))


def test_the_share_is_checked():
    import pytest
    with pytest.raises(ValueError, match="max_bytes"):
        Space(max_bytes=0)
