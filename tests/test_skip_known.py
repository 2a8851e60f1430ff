"""Cases a known crash takes are mostly answered without running them, once a case has shown the bug: one in
CHECK_EVERY still runs; a check that fails as no known bug does ends the skip at once, too few checks that fail as the
bug end it after MIN_CHECKS; a seeded run meets the same cases with the skip as without."""

from __future__ import annotations

from pathlib import Path

from attnfuzz.engine import skip_known
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.isolate import Worker
from attnfuzz.engine.profiles import profile
from attnfuzz.engine.skip_known import CHECK_EVERY, HOLDS_ONE_IN, MIN_CHECKS, SkipKnownCrashes, costly, faces
from attnfuzz.oracles import verdict as V
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store.known import known_bugs_of
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space
from attnfuzz.backends import get

SEGFAULTS = "tests.misbehaving:segfault_when_causal"
CAUSAL = Case(sq=4, skv=4, d_qk=8, d_v=8, causal=True)
CRASH = V.Verdict(V.CRASH, "SIGSEGV", "the worker process died (SIGSEGV) while running this case")
BUG = {"link": "tests/misbehaving.py", "note": "segfaults on causal cases", "when": {"causal": True}}


def _known(when=BUG["when"]):
    entry = corpus_io.Entry(SEGFAULTS, CAUSAL, CRASH, known_bug={**BUG, "when": when})
    return known_bugs_of([(Path("segv.json"), entry)])


class Scripted:
    """A worker that answers from a script and counts what it ran."""

    def __init__(self, answer):
        self.answer, self.ran = answer, 0

    def run(self, case):
        self.ran += 1
        return self.answer(self.ran, case)


def test_a_precise_crash_runs_one_case_in_check_every_and_answers_the_rest_as_the_known_bug():
    known = _known()
    worker = Scripted(lambda n, case: CRASH)
    skip = SkipKnownCrashes(worker, SEGFAULTS, known, faces(known, SEGFAULTS))
    verdicts = [skip.run(CAUSAL.replace(seed=s)) for s in range(2 * CHECK_EVERY + 1)]
    assert worker.ran == 3 and skip.skipped["segv"] == 2 * CHECK_EVERY - 2
    assert all(v.label == CRASH.label and known(SEGFAULTS, CAUSAL, v) is not None for v in verdicts)
    assert sum(v.message.startswith(skip_known.NOT_RUN) for v in verdicts) == 2 * CHECK_EVERY - 2
    assert skip.run(CAUSAL.replace(causal=False)).label == CRASH.label and worker.ran == 4, "outside `when`: run"
    assert "14 of segv" in skip.summary()


PASS = V.Verdict(V.PASS, None, "")


def _checks(skip, n):
    """The labels of n checked cases (each the first of a run of CHECK_EVERY), the skipped ones between them dropped."""
    return _run(skip, n * CHECK_EVERY)[::CHECK_EVERY]


def _run(skip, n):
    """The labels of n cases the record takes, run one after another."""
    return [skip.run(CAUSAL.replace(seed=s)).label for s in range(n)]


def test_a_kernel_fixed_since_skips_nothing_and_ends_the_skip_after_min_checks_clean_checks():
    """No check has failed as the bug: every case runs (each is a check), and MIN_CHECKS clean ones end the skip."""
    known = _known()
    worker = Scripted(lambda n, case: PASS)
    skip = SkipKnownCrashes(worker, SEGFAULTS, known, faces(known, SEGFAULTS))
    assert _run(skip, MIN_CHECKS - 1) == ["PASS"] * (MIN_CHECKS - 1) and not skip.imprecise
    assert worker.ran == MIN_CHECKS - 1 and not skip.skipped
    assert _run(skip, 1) == ["PASS"]
    assert skip.imprecise == {"segv"} and skip.checked["segv"] == MIN_CHECKS and skip.held["segv"] == 0
    ran = worker.ran
    labels = _run(skip, 2 * CHECK_EVERY)
    assert labels == ["PASS"] * 2 * CHECK_EVERY and worker.ran == ran + 2 * CHECK_EVERY, "every later case runs"
    assert "ran every case of segv" in skip.summary()


def test_the_skip_starts_at_the_first_check_that_fails_as_the_bug():
    """Two clean cases first (a record's condition wider than its bug): both run, nothing is answered unrun; the
    third faults as the bug, and from then on one case in CHECK_EVERY runs."""
    known = _known()
    worker = Scripted(lambda n, case: PASS if n <= 2 else CRASH)
    skip = SkipKnownCrashes(worker, SEGFAULTS, known, faces(known, SEGFAULTS))
    assert _run(skip, 3) == ["PASS", "PASS", CRASH.label] and worker.ran == 3 and not skip.skipped
    _run(skip, CHECK_EVERY - 2)   # the record's cases 4 .. CHECK_EVERY + 1: the last one is checked
    assert worker.ran == 4 and skip.skipped["segv"] == CHECK_EVERY - 3 and skip.held["segv"] == 2


def test_a_bug_that_fills_part_of_its_condition_keeps_the_skip():
    """A fault on some cases of the condition only (one check in four fails as it): the skip holds, the clean checks
    pass through graded, and the cases between checks are not run."""
    known = _known()
    worker = Scripted(lambda n, case: CRASH if n % 4 == 1 else PASS)
    skip = SkipKnownCrashes(worker, SEGFAULTS, known, faces(known, SEGFAULTS))
    checks = _checks(skip, 4 * MIN_CHECKS)
    assert checks.count(CRASH.label) == MIN_CHECKS and checks.count("PASS") == 3 * MIN_CHECKS
    assert not skip.imprecise and worker.ran == 4 * MIN_CHECKS
    assert skip.skipped["segv"] == 4 * MIN_CHECKS * (CHECK_EVERY - 1)
    assert f"({MIN_CHECKS} of {4 * MIN_CHECKS} checks failed as it)" in skip.summary()


def test_fewer_than_one_check_in_holds_one_in_failing_as_the_bug_ends_the_skip():
    known = _known()
    worker = Scripted(lambda n, case: CRASH if n % (2 * HOLDS_ONE_IN) == 1 else PASS)
    skip = SkipKnownCrashes(worker, SEGFAULTS, known, faces(known, SEGFAULTS))
    _checks(skip, 2 * HOLDS_ONE_IN)
    assert skip.imprecise == {"segv"}, "one check in 2 x HOLDS_ONE_IN held: too few"


def test_a_check_that_fails_as_no_known_bug_does_ends_the_skip_at_once():
    """Something else lives under the record's condition: every later case runs, so the search can shrink it."""
    known = _known()
    other = V.Verdict(V.FAIL, V.TOLERANCE, "off by one key")
    worker = Scripted(lambda n, case: CRASH if n == 1 else other)
    skip = SkipKnownCrashes(worker, SEGFAULTS, known, faces(known, SEGFAULTS))
    assert _checks(skip, 2) == [CRASH.label, other.label] and skip.imprecise == {"segv"}
    assert skip.checked["segv"] == 2 < MIN_CHECKS
    ran = worker.ran
    assert _run(skip, 3) == [other.label] * 3 and worker.ran == ran + 3


def test_a_check_that_shows_another_known_bug_counts_as_clean_not_as_news():
    crash_entry = corpus_io.Entry(SEGFAULTS, CAUSAL, CRASH, known_bug=BUG)
    leak = V.Verdict(V.FAIL, V.TOLERANCE, "off by one key")
    leak_entry = corpus_io.Entry(SEGFAULTS, CAUSAL, leak, known_bug={**BUG, "note": "leaks", "when": {}})
    known = known_bugs_of([(Path("segv.json"), crash_entry), (Path("leak.json"), leak_entry)])
    worker = Scripted(lambda n, case: leak)
    skip = SkipKnownCrashes(worker, SEGFAULTS, known, faces(known, SEGFAULTS))
    _run(skip, MIN_CHECKS - 1)
    assert not skip.imprecise and skip.held["segv"] == 0, "a known leak under the condition is no news"
    _run(skip, 1)
    assert skip.imprecise == {"segv"}, "nor the crash: none of MIN_CHECKS held"


def test_only_the_crash_and_hang_labels_of_bugs_that_failed_every_run_are_skipped():
    entry = corpus_io.Entry(SEGFAULTS, CAUSAL, V.Verdict(V.FAIL, V.TOLERANCE, "x"), known_bug=BUG)
    assert faces(known_bugs_of([(Path("tol.json"), entry)]), SEGFAULTS) == []
    also = corpus_io.Entry(SEGFAULTS, CAUSAL, V.Verdict(V.FAIL, V.TOLERANCE, "x"),
                           known_bug={**BUG, "labels": ["CRASH:SIGSEGV"]})
    # mostly wrong, a crash at times: a skipped case reads as the failure most of its cases show
    assert [f.label for _, f in faces(known_bugs_of([(Path("also.json"), also)]), SEGFAULTS)] == ["FAIL:TOLERANCE"]
    both = corpus_io.Entry(SEGFAULTS, CAUSAL, CRASH, known_bug={**BUG, "labels": ["HANG:HANG"]})
    assert [f.label for _, f in faces(known_bugs_of([(Path("both.json"), both)]), SEGFAULTS)] == \
        ["CRASH:SIGSEGV", "HANG:HANG"]
    flaky = corpus_io.Entry(SEGFAULTS, CAUSAL, V.Verdict(V.FLAKY, "CRASH:SIGSEGV", "in 2 of 4 runs"), known_bug=BUG)
    assert faces(known_bugs_of([(Path("flaky.json"), flaky)]), SEGFAULTS) == []
    assert faces(_known(), "another-backend") == [] and faces(lambda *a: None, SEGFAULTS) == []


def test_an_exception_the_kernel_survives_is_not_skipped_a_costly_crash_is():
    """Skipping saves a worker, a GPU stall or a build; a RuntimeError of the kernel's own checks costs none of them,
    so its record's cases all run (a bug under its condition stays findable), while the costly faces still skip."""
    raised = V.Verdict(V.CRASH, "RuntimeError", "RuntimeError: Input tensor must have contiguous last dimension")
    cuda = V.Verdict(V.CRASH, "AcceleratorError", "AcceleratorError: CUDA error: misaligned address")
    build = V.Verdict(V.CRASH, "CompilerDiagnosticError", "PTX assembly failed: Insufficient registers")
    assert costly(CRASH) and costly(cuda) and costly(V.Verdict(V.HANG, "HANG", "")) and costly(
        V.Verdict(V.CRASH, "EXIT_1", "")) and costly(build, ("CompilerDiagnosticError",))
    assert not costly(raised) and not costly(build), "an exception that is neither a CUDA error nor a build's"
    entry = corpus_io.Entry(SEGFAULTS, CAUSAL, raised, known_bug=BUG)
    known = known_bugs_of([(Path("raises.json"), entry)])
    assert faces(known, SEGFAULTS) == []
    worker = Scripted(lambda n, case: raised)
    assert skip_known.skipping(worker, SEGFAULTS, known) is worker, "nothing to skip: the worker runs every case"
    built = corpus_io.Entry(SEGFAULTS, CAUSAL, build, known_bug=BUG)
    assert faces(known_bugs_of([(Path("b.json"), built)]), SEGFAULTS, ("CompilerDiagnosticError",)) != []
    assert faces(known_bugs_of([(Path("b.json"), built)]), SEGFAULTS) == []


def test_a_seeded_isolated_run_meets_the_same_cases_with_fewer_workers():
    settings = profile("ci", max_examples=60)
    space = Space(max_len=16, max_batch=2, max_heads=2)
    runs = {}
    for name, known in (("skip", _known()), ("run all", _clear(_known()))):
        with Worker(SEGFAULTS, timeout_s=30) as worker:
            tally, findings = fuzz(get(SEGFAULTS), space=space, settings=settings, known=known, worker=worker,
                                   reruns=0)
            runs[name] = (dict(tally.labels), findings, worker.restarts, tally.not_run)
    (labels, findings, restarts, note), (labels_all, findings_all, restarts_all, note_all) = runs.values()
    assert labels == labels_all and labels.get("KNOWN:SIGSEGV", 0) > CHECK_EVERY, labels   # the same cases, all known
    assert findings == findings_all == []
    assert restarts < restarts_all and note and note_all is None, (restarts, restarts_all)


def _clear(known):
    known.crash_faces = []   # the same record, with nothing to skip by
    return known



def test_a_refused_check_is_no_check_and_the_next_case_is_checked():
    """A kernel that refuses a case at call time ran nothing: the record is neither confirmed nor doubted by it."""
    known = _known()
    refused = V.Verdict(V.UNSUPPORTED, None, "p.query_ptr is not correctly aligned")
    worker = Scripted(lambda n, case: refused if n <= 2 * MIN_CHECKS else CRASH)
    skip = SkipKnownCrashes(worker, SEGFAULTS, known, faces(known, SEGFAULTS))
    labels = _run(skip, 2 * MIN_CHECKS + 1)
    assert labels == ["UNSUPPORTED"] * 2 * MIN_CHECKS + [CRASH.label] and worker.ran == 2 * MIN_CHECKS + 1
    assert not skip.imprecise and skip.checked["segv"] == 1 and skip.held["segv"] == 1
    skip.run(CAUSAL.replace(seed=99))
    assert worker.ran == 2 * MIN_CHECKS + 1 and skip.skipped["segv"] == 1, "checked again, then skipping"


def test_a_record_takes_a_failure_that_another_record_is_named_for():
    crash_entry = corpus_io.Entry(SEGFAULTS, CAUSAL, CRASH, known_bug=BUG)
    broad = corpus_io.Entry(SEGFAULTS, CAUSAL, CRASH, known_bug={**BUG, "note": "any segfault", "when": {}})
    known = known_bugs_of([(Path("broad.json"), broad), (Path("segv.json"), crash_entry)])
    assert known(SEGFAULTS, CAUSAL, CRASH)["id"] == "broad", "the first record is named"
    assert known.takes("segv", SEGFAULTS, CAUSAL, CRASH) and known.takes("broad", SEGFAULTS, CAUSAL, CRASH)
    assert not known.takes("segv", SEGFAULTS, CAUSAL.replace(causal=False), CRASH)
    skip = SkipKnownCrashes(Scripted(lambda n, case: CRASH), SEGFAULTS, known, [("segv", CRASH)])
    _checks(skip, MIN_CHECKS)
    assert not skip.imprecise and skip.held["segv"] == MIN_CHECKS, "each check held, though 'broad' is named"
