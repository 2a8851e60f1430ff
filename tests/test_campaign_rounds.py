"""A campaign's rounds. One round in `climb_every` climbs toward the worst error / bound (Hypothesis's target phase),
not every round: a climb spends half its round on one case, and the Pareto front it leaves in the example database is
where the next climb starts again. A round cut by time leaves nothing in the example database, and the Pareto front
keeps only what it holds."""

from __future__ import annotations

import json
import time
from collections import Counter

import hypothesis
import pytest
from hypothesis import Phase, given, settings, strategies as st
from hypothesis.database import InMemoryExampleDatabase

from attnfuzz.campaign import lane as lane_mod
from attnfuzz.campaign.database import KeepFailures
from attnfuzz.campaign.lane import CLIMB_EVERY, Lane, Resumable, TimeUp, round_phases
from attnfuzz.engine.harness import Tally


def test_the_target_phase_comes_in_one_round_in_climb_every():
    climbs = [r for r in range(12) if Phase.target in round_phases(r, 4)]
    assert climbs == [3, 7, 11]
    assert all(Phase.target in round_phases(r, 1) for r in range(5)), "1 climbs every round"
    assert not any(Phase.target in round_phases(r, 0) for r in range(50)), "0 never climbs"
    assert all(set(round_phases(r, 4)) >= {Phase.reuse, Phase.generate, Phase.shrink} for r in range(8))
    assert CLIMB_EVERY > 1


def rounds_phases(tmp_path, monkeypatch, config: dict, rounds: int, database=None) -> list[tuple]:
    """The phases Lane._round hands Hypothesis in rounds 0..rounds-1 (the search itself stubbed out), each with
    whether `database` (a KeepFailures) took the round as climbing."""
    (tmp_path / "campaign.json").write_text(json.dumps({"device": "cpu", "hours": 1.0, "max_len": None,
                                                       "round_examples": 20, "round_seconds": 60, **config}))
    (tmp_path / "state").mkdir()
    seen = []

    def fake_fuzz(backend, *, settings, **_):
        seen.append(tuple(settings.phases) if database is None else database.climbing)
        return Tally(examples=0), []

    monkeypatch.setattr(lane_mod, "fuzz", fake_fuzz)
    lane = Lane(tmp_path, 0)
    backend = lane_mod.get("sdpa-math", "cpu")
    runner = Resumable(backend.name, None, None, tmp_path / ".inflight", {}, time.perf_counter() + 60, 0)
    for r in range(rounds):
        lane._round(backend, r, runner, database, lane.space())
    return seen


def test_a_lanes_rounds_follow_the_campaigns_climb_every(tmp_path, monkeypatch):
    seen = rounds_phases(tmp_path, monkeypatch, {"climb_every": 2}, 4)
    assert [Phase.target in phases for phases in seen] == [False, True, False, True]


def test_the_database_knows_which_rounds_climb(tmp_path, monkeypatch):
    database = KeepFailures(InMemoryExampleDatabase())
    assert rounds_phases(tmp_path, monkeypatch, {"climb_every": 2}, 4, database) == [False, True, False, True]


def test_a_campaign_saved_before_climb_every_existed_climbs_at_the_default(tmp_path, monkeypatch):
    seen = rounds_phases(tmp_path, monkeypatch, {}, CLIMB_EVERY)
    assert [Phase.target in phases for phases in seen] == [False] * (CLIMB_EVERY - 1) + [True]


def test_replay_only_stays_reuse_and_shrink(tmp_path, monkeypatch):
    seen = rounds_phases(tmp_path, monkeypatch, {"climb_every": 1, "replay_only": True}, 2)
    assert seen == [(Phase.reuse, Phase.shrink)] * 2


def saved_after_time_up(database) -> list:
    """Run a search that raises TimeUp on its fifth example (as Resumable does once the round's time is up) and
    return what the database holds then."""
    calls = []

    @settings(database=database, max_examples=50, phases=[Phase.generate])
    @given(st.integers())
    def search(n):
        calls.append(n)
        if len(calls) == 5:
            if isinstance(database, KeepFailures):
                database.deadline = time.perf_counter() - 1
            raise TimeUp()

    with pytest.raises(TimeUp):
        search()
    inner = database.inner if isinstance(database, KeepFailures) else database
    return [v for values in inner.data.values() for v in values]


def test_a_round_cut_by_time_saves_no_example_to_replay():
    assert saved_after_time_up(InMemoryExampleDatabase()), "control: Hypothesis saves the example TimeUp escaped"
    assert saved_after_time_up(KeepFailures(InMemoryExampleDatabase())) == []


def test_a_failure_within_the_round_is_still_saved():
    database = KeepFailures(InMemoryExampleDatabase())
    database.deadline = time.perf_counter() + 60

    @settings(database=database, max_examples=50, phases=[Phase.generate, Phase.shrink])
    @given(st.integers())
    def search(n):
        assert n < 10

    with pytest.raises(AssertionError):
        search()
    assert database.inner.data, "the failure is in the database for the next round and the other lanes"


def climbing_search(database, examples: int = 200) -> None:
    """A search that climbs a target score, with `database` under the key b"k" (so its Pareto front is kept there)."""
    @settings(database=database, max_examples=examples, phases=tuple(Phase))
    @given(st.lists(st.integers(0, 1000), max_size=8))
    def search(xs):
        hypothesis.target(float(sum(xs)), label="sum")

    search._hypothesis_internal_database_key = b"k"
    search()


class Counted(InMemoryExampleDatabase):
    """An in-memory database that counts what it is asked to save and delete, per key."""

    def __init__(self):
        super().__init__()
        self.saved, self.deleted = Counter(), Counter()

    def save(self, key, value):
        self.saved[key] += 1
        super().save(key, value)

    def delete(self, key, value):
        self.deleted[key] += 1
        super().delete(key, value)


def test_the_pareto_front_evicts_its_own_entries_but_no_failure_is_deleted():
    kept = KeepFailures(Counted())
    kept.save(b"k", b"a failure")
    kept.delete(b"k", b"a failure")
    kept.delete(b"k.secondary", b"x")
    assert list(kept.fetch(b"k")) == [b"a failure"], "a failure stays for the other lanes"
    climbing_search(kept)
    inner = kept.inner
    front = len(list(kept.fetch(b"k.pareto")))
    assert inner.deleted[b"k.pareto"] > 0, "the front evicted entries, and they left the database"
    assert 0 < front < inner.saved[b"k.pareto"]


def plain_search(database, examples: int = 60) -> None:
    """A round without the target phase under the same key: it reports no score, as the harness does there."""
    @settings(database=database, max_examples=examples, phases=tuple(p for p in Phase if p != Phase.target))
    @given(st.lists(st.integers(0, 1000), max_size=8))
    def search(xs):
        pass

    search._hypothesis_internal_database_key = b"k"
    search()


def test_a_round_that_does_not_climb_leaves_the_front_to_the_next_one_that_does():
    kept = KeepFailures(Counted())
    climbing_search(kept)
    front = sorted(kept.inner.fetch(b"k.pareto"))
    assert front
    deleted = kept.inner.deleted[b"k.pareto"]
    kept.climbing = False
    plain_search(kept)
    assert sorted(kept.inner.fetch(b"k.pareto")) == front, "the front is the climbing rounds' own"
    assert kept.inner.deleted[b"k.pareto"] == deleted
    control = Counted()   # without KeepFailures, the same round replays the front and deletes it
    for value in front:
        control.save(b"k.pareto", value)
    plain_search(control)
    assert len(list(control.fetch(b"k.pareto"))) < len(front)


def test_a_resumed_campaign_takes_a_new_climb_every_and_an_old_one_gets_it():
    from types import SimpleNamespace
    from attnfuzz.campaign.supervisor import resumed_config
    stored = {"backends": ["sdpa-math"], "skipped": {}, "device": "cpu", "db": "db", "round_examples": 200,
              "round_seconds": 900.0, "case_timeout": 120.0, "max_len": None, "hours": 1.0, "replay_only": False}
    args = SimpleNamespace(backends=None, device=None, db=None, round_examples=None, round_seconds=None,
                           case_timeout=None, max_len=None, hours=None, replay_only=False, climb_every=0,
                           compile_time_share=None)
    assert resumed_config(args, dict(stored))["climb_every"] == 0
    assert "climb_every" not in resumed_config(SimpleNamespace(**{**vars(args), "climb_every": None}), dict(stored))
    # the compile time share likewise: a new one from here on, else the stored one (or, stored before it, the default)
    assert resumed_config(SimpleNamespace(**{**vars(args), "compile_time_share": 0.0}),
                          dict(stored))["compile_time_share"] == 0.0
    assert "compile_time_share" not in resumed_config(args, dict(stored))


def test_a_campaign_in_a_ci_environment_is_not_derandomized():
    """Hypothesis's CI detection makes its derandomized profile the parent of every profile registered after it: a
    campaign there drew the same cases every round, without its example database."""
    import os
    import subprocess
    import sys
    code = ("from attnfuzz.engine.profiles import profile; s = profile('campaign'); "
            "print(s.derandomize, profile('ci').derandomize)")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CI": "true"}, capture_output=True,
                          text=True, check=True)
    assert done.stdout.split() == ["False", "True"], done.stdout + done.stderr
