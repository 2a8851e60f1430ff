"""`pytest corpus`: every saved finding replayed as a regression test.

An entry passes when its backend now passes the case. An entry marked as a known bug (`known_bug: {"link": ...}`) is
an expected failure, and fails loudly once it starts passing, so it gets marked fixed. An entry whose backend cannot
run here is skipped with the reason; an unreadable file fails alone, naming the file and the field. With
`--isolate` each entry runs in a worker process: a crash that poisons CUDA costs that entry, not the ones after it;
`--attnfuzz-replay-workers N` runs N entries at once. The summary lists each entry's replay time.
"""

from __future__ import annotations

import pytest

from attnfuzz.store import corpus as corpus_io
from attnfuzz.cli import changed_label, replay_outcome
from attnfuzz.store.known import predates


def test_entry(corpus_entry, attnfuzz_replay) -> None:
    entry = corpus_io.load(corpus_entry)  # CorpusError names the file and the field
    verdict = attnfuzz_replay(corpus_entry, entry)
    outcome = replay_outcome(entry, verdict)
    if outcome == "skip":
        pytest.skip(verdict.message)
    if outcome == "unreproduced":
        how = " (output it never writes: --attnfuzz-poison-memory shows it every time)" * bool(
            entry.known_bug.get("unwritten"))
        pytest.skip(f"flaky known bug {entry.known_bug['link']} did not come back this run{how}")
    if outcome == "predates":
        pytest.skip(predates(entry.known_bug))
    if outcome == "xfail":
        pytest.xfail(f"known bug {entry.known_bug['link']}: {verdict.label}{changed_label(entry, verdict)}")
    if outcome == "xpass":
        pytest.fail(f"known bug {entry.known_bug['link']} NOW PASSES: {corpus_entry.name} — mark it fixed "
                    f"(remove known_bug) so it guards against a regression", pytrace=False)
    assert outcome == "pass", f"{corpus_entry.name}: {verdict.label}: {verdict.message}"
