"""Every test runs with its own findings folder and its own per-user data folder: nothing a test finds lands in the
user's per-user corpus, in the shipped one or in the user's Hypothesis example database (subprocesses inherit them
through the environment)."""

import pytest


@pytest.fixture(autouse=True)
def _own_findings_folder(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ATTNFUZZ_CORPUS", str(tmp_path_factory.mktemp("findings")))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data")))
