"""The shipped corpus's known-bug records, asked which one takes a failure (tests of records' precision)."""

from __future__ import annotations

from pathlib import Path

from attnfuzz.store import corpus as corpus_io

SHIPPED = corpus_io.known_bugs(Path(__file__).resolve().parents[1] / "corpus")


def taken(backend, case, verdict) -> str | None:
    """The id (file stem) of the shipped record that takes this failure, or None."""
    hit = SHIPPED(backend, case, verdict)
    return hit and hit["id"]
