"""`attnfuzz known ENTRY`: mark a finding as a known bug, with the record that takes its failures and no others
(--when narrows it to cases like this one, --match to messages holding a substring)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnfuzz.engine.rootcause import by_twin
from attnfuzz.oracles import verdict as V
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store.known import TRAITS, known_bugs_of, record_problem, when_fields


class BadRecord(Exception):
    """A record the options would write wrong: the message names the option and the fix (exit 2)."""


def cmd_known(args) -> int:
    try:
        return _mark(args)
    except (corpus_io.CorpusError, BadRecord) as e:   # bad usage: the message names the option and the fix
        print(f"attnfuzz known: {e}", file=sys.stderr)
        return 2


def _mark(args) -> int:
    entry = corpus_io.load(args.entry)
    when = {}
    for item in args.when:
        field, _, value = item.partition("=")
        try:
            when[field] = json.loads(value)
        except json.JSONDecodeError:
            raise BadRecord(f"--when {item!r}: give FIELD=JSON, e.g. dtype='\"float64\"' or causal=true") from None
        if field not in when_fields(entry.case):
            raise BadRecord(f"--when {item!r}: {field!r} is neither a Case field nor a trait "
                             f"({', '.join(TRAITS)})")
    bad = [label for label in args.label if label.split(":")[0] not in V.FAILED]
    if bad:
        raise BadRecord(f"--label {bad[0]!r}: give a failing verdict label, e.g. FAIL:NONFINITE or CRASH:SIGSEGV")
    entry.known_bug = {"link": args.link, "note": args.note, "match": args.match, "when": when}
    problem = record_problem(entry.known_bug, entry.case)
    if problem:
        raise BadRecord(f"--when: {problem}")
    # the labels the run attached to this finding are the same root cause: the record takes them too, but for those
    # its probe twin joined (TOLERANCE, say): a run takes them by their twins (rootcause.twin_known), not by label
    labels = set(args.label) | {v.label for _, v in entry.attached if not by_twin(entry.verdict, v)}
    if labels - {entry.verdict.label}:
        entry.known_bug["labels"] = sorted(labels - {entry.verdict.label})
    missed = unanswered(args.entry, entry)
    if missed:
        raise BadRecord(f"the record would not take {', '.join(missed)} of this finding's own failures: widen or "
                         f"drop --when / --match")
    data = json.loads(args.entry.read_text())
    data["known_bug"] = entry.known_bug
    args.entry.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"{args.entry}: marked as known bug {args.link}")
    return 0


def unanswered(path: Path, entry: corpus_io.Entry) -> list[str]:
    """The failures of a finding (its own, then each attached one but those its probe twin joined, which a run takes
    by their twins) that its known_bug record would not take: a `when` or `match` narrower than the bug found."""
    known = known_bugs_of([(path, entry)])
    failures = [(entry.case, entry.verdict), *((c, v) for c, v in entry.attached if not by_twin(entry.verdict, v))]
    return [f"{v.label} on {c!r}" for c, v in failures if known(entry.backend, c, v) is None]
