"""Every test runs with its own findings folder: nothing a test finds lands in the user's per-user corpus or in the
shipped one (subprocesses inherit it through the environment)."""

import pytest


@pytest.fixture(autouse=True)
def _own_findings_folder(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ATTNFUZZ_CORPUS", str(tmp_path_factory.mktemp("findings")))
