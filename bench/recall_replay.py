"""bench/recall.py's replay of the chosen entries before it searches: an entry whose case no longer fails on this
stack (a bug its kernel fixed, or a case it now refuses) is left out, with why. No search could find it, and
counting it would measure the stack, not the search."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # bench.recall_child, wherever this file is imported from
from bench.recall_child import child  # noqa: E402


def reproduces(corpus: str, names: list[str], device: str, case_timeout: float, tries: int) -> dict:
    """{entry: None where its case still fails here, else why not}: each entry's case replayed as `attnfuzz replay
    --isolate` does, up to `tries` times (a FLAKY entry fails in some runs only). An entry every replay passes, or
    every replay is refused, is no bug of this stack (fixed, or another kernel version): a search could not find
    it, and counting it would measure the stack, not the search. A replay that fails otherwise keeps the entry."""
    from attnfuzz.oracles.verdict import PASS, UNSUPPORTED
    from attnfuzz.store import corpus as corpus_io
    from attnfuzz.store.replay import Replayer
    from attnfuzz.engine.isolate import Workers
    entries = {p.name: e for p, e in corpus_io.load_all(Path(corpus))[0] if p.name in names}
    sys.path += sorted({e.kernel_path for e in entries.values() if e.kernel_path} - set(sys.path))  # (its workers too)
    workers = Workers(timeout_s=case_timeout)
    replayed = Replayer(workers)
    why: dict = {}
    try:
        for name, entry in entries.items():
            seen = []
            for _ in range(tries):
                verdict = replayed(entry, device)
                if verdict.status not in (PASS, UNSUPPORTED):
                    break
                seen.append(verdict)
            if len(seen) < tries:
                why[name] = None
            elif all(v.status == PASS for v in seen):
                why[name] = f"does not fail here: its case passed {tries} replay(s)"
            else:
                why[name] = f"its case is refused here: {seen[-1].message[:200]}"
    finally:
        workers.close()
    return why


AT_ONCE = 4   # replay processes at once


def spread(batches: list[list[str]], ways: int = AT_ONCE) -> list[list[str]]:
    """The batches cut so that `ways` processes share the replays: none holds more than its share of all the
    entries (else a backend's entries, each compiling its kernel, replay one after another in one process, for
    minutes before the search begins)."""
    share = max(1, -(-sum(map(len, batches)) // ways))
    return [batch[i:i + share] for batch in batches for i in range(0, len(batch), share)]


def leave_out_unreproduced(chosen: dict, batches: list[list[str]], site: Path | None, corpus: str, args) -> None:
    """Moves the chosen entries whose cases do not fail here from chosen["run"] to chosen["not_run"], with why:
    `reproduces` asked in one process a batch (entries of one backend), AT_ONCE processes at once."""
    batches = spread(batches)
    print(f"recall.py: replaying {sum(map(len, batches))} entries ({args.replays} tries each, {AT_ONCE} processes at "
          f"once) before the search", file=sys.stderr)
    def ask(group: list[str]) -> dict:
        what = chosen["run"][group[0]]
        answer = child(site, "recall_replay.reproduces", corpus, group, args.device, args.case_timeout, args.replays,
                       isa=what.get("isa"), timeout=120 + len(group) * args.replays * (args.case_timeout + 30))
        if "error" in answer:   # a replay that could not finish keeps its entries
            print(f"recall.py: replaying {', '.join(group)} did not finish ({answer['error'][-300:]}): searched for "
                  f"all the same", file=sys.stderr)
            return {}
        return answer
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        for answer in pool.map(ask, batches):
            for name, why in answer.items():
                if why is not None:
                    chosen["not_run"][name] = why
                    del chosen["run"][name]
