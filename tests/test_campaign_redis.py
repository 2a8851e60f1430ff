"""Several machines, one campaign: two campaign processes share one real Redis example database and each replays the
failures the other found. `.ci/run` installs Debian's redis-server and starts it on loopback (ATTNFUZZ_TEST_REDIS);
elsewhere the test starts its own when the binary is there."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from tests.test_campaign import ROOT, campaign_command, logged, run_campaign, saved_labels

pytestmark = pytest.mark.slow  # two real campaigns against a real Redis

ZERO, NAN = "tests.misbehaving:zero_when_causal", "tests.misbehaving:nan_when_long"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url():
    redis = pytest.importorskip("redis") if not os.environ.get("CI") else __import__("redis")
    url = os.environ.get("ATTNFUZZ_TEST_REDIS")
    server = None
    if url is None:
        if shutil.which("redis-server") is None:
            if os.environ.get("CI"):
                pytest.fail("redis-server is not installed: .ci/run installs Debian's package and starts it")
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        port = _free_port()
        server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no"], stdout=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        for _ in range(100):
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    if server is not None:
        server.terminate()
        server.wait()


def test_two_campaigns_replay_each_others_failures_through_redis(tmp_path, redis_url):
    options = ["--db", redis_url, "--hours", "0.004", "--round-examples", "100"]
    a = subprocess.Popen(campaign_command(tmp_path / "a", "--backends", ZERO, *options), cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    b = subprocess.Popen(campaign_command(tmp_path / "b", "--backends", NAN, *options), cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert a.wait(timeout=240) == 1, a.stderr.read()
    assert b.wait(timeout=240) == 1, b.stderr.read()
    assert (ZERO, "FAIL:ALL_ZERO") in saved_labels(tmp_path / "a")
    assert (NAN, "FAIL:NONFINITE") in saved_labels(tmp_path / "b")

    # Each now replays the other's backend from the shared database, drawing nothing new.
    a_gets_b = run_campaign(tmp_path / "a2", "--backends", NAN, "--db", redis_url, "--replay-only")
    b_gets_a = run_campaign(tmp_path / "b2", "--backends", ZERO, "--db", redis_url, "--replay-only")
    assert a_gets_b.returncode == 1, a_gets_b.stderr
    assert b_gets_a.returncode == 1, b_gets_a.stderr
    assert (NAN, "FAIL:NONFINITE") in saved_labels(tmp_path / "a2")
    assert (ZERO, "FAIL:ALL_ZERO") in saved_labels(tmp_path / "b2")
    replayed = logged(tmp_path / "b2")
    assert replayed[0]["label"] == "FAIL:ALL_ZERO", "the first case b2 ran was a's failure, from Redis"


def test_replay_only_on_an_empty_database_finds_nothing(tmp_path, redis_url):
    """Control: without the other campaign's failures in Redis, replay-only draws no case and finds no bug."""
    result = run_campaign(tmp_path / "c", "--backends", ZERO, "--db", redis_url, "--replay-only")
    assert result.returncode == 0, result.stderr
    assert not saved_labels(tmp_path / "c") and not logged(tmp_path / "c")
