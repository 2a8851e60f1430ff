"""Every test runs with its own findings folder and its own per-user data folder: nothing a test finds lands in the
user's per-user corpus, in the shipped one or in the user's Hypothesis example database (subprocesses inherit them
through the environment).

Every test also runs under seed_only_streams (strategies/streams.py), as `attnfuzz run` searches: a test's
derandomized `@given` then draws the same examples whether it runs alone or after the rest of the suite was imported
(Hypothesis's pool of local-module constants would otherwise move them, and a threshold measured on them). Tests of
that very behaviour opt out with the marker own_streams."""

import pytest

from attnfuzz.strategies.streams import seed_only_streams


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "own_streams: run on Hypothesis's own constant pool and engine clock, not "
                                       "under seed_only_streams (tests of seed_only_streams itself)")


@pytest.fixture(autouse=True)
def _own_findings_folder(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ATTNFUZZ_CORPUS", str(tmp_path_factory.mktemp("findings")))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data")))


@pytest.fixture(autouse=True)
def _streams_of_the_seed_alone(request):
    if request.node.get_closest_marker("own_streams"):
        yield
        return
    with seed_only_streams():
        yield
