"""`attnfuzz run --compile-time-share S`: a run that is neither seeded nor derandomized searches a compiling backend
as a campaign does (its Space carries the share: tests/test_time_balance.py shows what the search does with it); a
seeded or derandomized run refuses the option with the fix, since its cases must come out the same on any machine."""

from __future__ import annotations

import pytest

from attnfuzz import cli
from attnfuzz.engine.harness import Tally


@pytest.fixture
def spaces(monkeypatch):
    seen = []

    def fake_fuzz(backend, *, space, settings, **_):
        seen.append((space.compile_time_share, settings.derandomize))
        return Tally(examples=0), []

    monkeypatch.setattr(cli, "fuzz", fake_fuzz)
    return seen


def _run(tmp_path, *options) -> int:
    return cli.main(["run", "--backend", "sdpa-math", "--max-examples", "5", "--corpus", str(tmp_path / "found"),
                     *options])


def test_the_share_reaches_the_search(tmp_path, spaces):
    assert _run(tmp_path, "--profile", "campaign", "--compile-time-share", "0.5") == 0
    assert _run(tmp_path, "--profile", "campaign") == 0
    assert spaces == [(0.5, False), (None, False)]   # without the option: the fixed share


@pytest.mark.parametrize("options, named", [(["--profile", "ci"], "derandomized profile (ci)"),
                                            (["--profile", "campaign", "--seed", "3"], "--seed")])
def test_a_reproducible_run_refuses_the_share_with_the_fix(tmp_path, spaces, capsys, options, named):
    assert _run(tmp_path, *options, "--compile-time-share", "0.5") == 2
    err = capsys.readouterr().err
    assert "--compile-time-share 0.5" in err and named in err and "drop --compile-time-share" in err
    assert spaces == []
    assert _run(tmp_path, *options, "--compile-time-share", "0") == 0   # 0: the fixed share, as without it
