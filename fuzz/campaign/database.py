"""A campaign's example database: Hypothesis's (a directory, or Redis shared by machines), wrapped so that a lane
never erases a failure other lanes have yet to replay, and a climbing round's Pareto front stays its own."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase


PARETO_SUFFIX = b".pareto"   # Hypothesis keeps its Pareto front of target scores under the test's key + this


class KeepFailures(ExampleDatabase):
    """The campaign's example database, minus deletion: a lane that has already saved a failure (so no longer raises
    it) must not erase it before other lanes and machines have replayed it. The Pareto front of a climbing round
    still evicts its own entries, else every case that ever joined it stays (5,217 files in a 90-second CPU campaign
    that climbed every round). It saves nothing after `deadline` (perf_counter; the lane sets it to each round's):
    Hypothesis saves the example a BaseException escapes from as a failure to replay, and TimeUp is one, so each
    round cut by time would leave a passing case for every later round and every other lane to replay first.
    The front is the climbing rounds' own (`climbing`, set per round): a round without the target phase reports no
    scores, so Hypothesis's reuse phase would replay the front's cases there only to find them outside its (empty)
    front and delete them, leaving the next climbing round nothing to start from."""

    def __init__(self, inner: ExampleDatabase):
        super().__init__()
        self.inner = inner
        self.deadline = float("inf")
        self.climbing = True

    def save(self, key: bytes, value: bytes) -> None:
        if time.perf_counter() <= self.deadline:
            self.inner.save(key, value)

    def fetch(self, key: bytes):
        if key.endswith(PARETO_SUFFIX) and not self.climbing:
            return iter(())
        return self.inner.fetch(key)

    def delete(self, key: bytes, value: bytes) -> None:
        if key.endswith(PARETO_SUFFIX) and self.climbing:   # the front evicting what it no longer holds: no failure
            self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(src, dest, value)


def open_database(spec: str, campaign: Path) -> ExampleDatabase:
    """A redis:// URL (hypothesis.extra.redis), or a directory (relative paths are inside the campaign)."""
    if spec.startswith(("redis://", "rediss://", "unix://")):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
        return KeepFailures(RedisExampleDatabase(redis.Redis.from_url(spec), key_prefix=b"attnfuzz:"))
    path = Path(spec) if Path(spec).is_absolute() else campaign / spec
    return KeepFailures(DirectoryBasedExampleDatabase(str(path)))
