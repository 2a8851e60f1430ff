"""On a GPU four long lengths in five sit at a tile residue (Space.long_edge_odds), at the same share of long cases;
on a CPU half of them, as before."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.features import at_tile_edge
from attnfuzz.strategies.lengths import SMALL_LEN
from attnfuzz.strategies.space import Space


def _long_lengths(space: Space, n: int = 500) -> tuple[list[int], int]:
    lengths, longs = [], [0]

    @settings(max_examples=n, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(attention_cases(space.replace(long_one_in=2)))
    def collect(case):
        longs[0] += max(case.sq, case.skv) > SMALL_LEN
        lengths.extend(n for n in (case.sq, case.skv) if n > SMALL_LEN)

    collect()
    return lengths, longs[0]


def _edge_share(lengths: list[int]) -> float:
    return sum(map(at_tile_edge, lengths)) / len(lengths)


def test_a_gpu_draws_most_long_lengths_at_tile_edges_and_a_cpu_half():
    gpu, gpu_longs = _long_lengths(Space.for_device("cuda"))
    cpu, _ = _long_lengths(Space.for_device("cuda").replace(long_edge_odds=1.0))
    assert len(gpu) >= 150 and len(cpu) >= 150
    assert _edge_share(gpu) >= 0.7, _edge_share(gpu)
    assert 0.35 <= _edge_share(cpu) <= 0.65, _edge_share(cpu)   # the control: the odds are what moves it
    assert Space.for_device("cpu").long_edge_odds == 1.0        # CPU streams draw as they did


def test_the_odds_are_checked():
    import pytest
    with pytest.raises(ValueError, match="long_edge_odds"):
        Space(long_edge_odds=0)
