"""Target scores go to Hypothesis only where something reads them: with an example database and no target phase they
fed only the Pareto front Hypothesis keeps beside the database, at the cost of a small case per case. And a
derandomized search's stream does not depend on the harness's source."""

from __future__ import annotations

from hypothesis import Phase, settings
from hypothesis.database import InMemoryExampleDatabase

from attnfuzz.backends import get
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.strategies.space import Space
from attnfuzz.strategies.streams import DERANDOMIZED_SEED, stream_seed

SMALL = Space(max_batch=1, max_len=8, max_heads=2, max_head_dim=16)


def pareto_entries(phases) -> int:
    database = InMemoryExampleDatabase()
    fuzz(get("sdpa-math", "cpu"), space=SMALL, database_key="sdpa-math",
         settings=settings(profile("quick"), database=database, max_examples=40, phases=phases, derandomize=False))
    return sum(len(values) for key, values in database.data.items() if key.endswith(b".pareto"))


def test_no_pareto_front_without_the_target_phase():
    assert pareto_entries(tuple(p for p in Phase if p != Phase.target)) == 0
    assert pareto_entries(tuple(Phase)) > 0, "control: the target phase keeps its front in the database"


def test_a_derandomized_search_runs_with_the_pinned_seed():
    assert stream_seed(None, derandomize=True) == DERANDOMIZED_SEED
    assert stream_seed(7, derandomize=True) == 7
    assert stream_seed(None, derandomize=False) is None


def test_a_seeded_search_keeps_its_scores_and_its_stream():
    """A seeded run keeps no example database (hypothesis.seed), so its scores cost nothing and still steer which
    mutations it keeps: the same seed draws the same cases with a database named or not."""
    def stream(database):
        cases = []
        fuzz(get("sdpa-math", "cpu"), space=SMALL, seed=3, on_case=lambda c, v, t: cases.append(c),
             settings=settings(profile("quick"), database=database, max_examples=150))
        return cases
    assert stream(InMemoryExampleDatabase()) == stream(None)
