"""Fuzz targets collected by `pytest fuzz`: one per backend (`--attnfuzz-backend` narrows), graded against float64.

A backend that cannot run here is skipped with the reason; every failure is shrunk by Hypothesis, saved to the
corpus (JSON + standalone repro script) and reported. The case being run waits on disk (`.inflight-<backend>.json`
in the corpus), so a session killed by a segfault leaves it behind, with a crash record beside it: the next session
saves it as CRASH:PROCESS_DIED and fails with it. Ctrl-C or SIGTERM interrupt the session (pytest's exit 2); the case
it was running is no finding, a failure graded before the stop is saved as far as its shrink had got. A case left by a
session killed from outside (SIGKILL) is kept under .stopped/ and warned about, not failed on
(attnfuzz.store.inflight.recover_inflight).
"""

from __future__ import annotations

import contextlib
import sys
import warnings

import pytest

from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import examples
from attnfuzz.store import inflight as inflight_io
from attnfuzz.engine import interrupt
from attnfuzz.backends import get
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.isolate import isolated
from attnfuzz.engine.options import isolating
from attnfuzz.engine.profiles import for_backend, profile
from attnfuzz.strategies.space import Space


class StoppedCase(UserWarning):
    """The last session stopped mid-case with nothing to show the case ended it: kept for replay, not a finding."""


def test_backend(fuzz_backend: str, attnfuzz, pytestconfig) -> None:
    backend = get(fuzz_backend, attnfuzz.device)
    # the worker imports the backend's library while this process does the same to ask about availability
    worker = isolated(backend, attnfuzz.device, attnfuzz.case_timeout,
                      enabled=isolating(attnfuzz.device, attnfuzz.isolate, attnfuzz.no_isolate))
    why = backend.available()
    if why is not None:
        if worker is not None:
            worker.close()
        pytest.skip(f"{fuzz_backend} cannot run on {attnfuzz.device}: {why}")
    settings = for_backend(examples.kept_here(profile(attnfuzz.profile, max_examples=attnfuzz.max_examples,
                                                      report_multiple_bugs=not attnfuzz.first_bug)),
                           backend.cost, attnfuzz.max_examples)
    findings_dir = corpus_io.findings_dir(attnfuzz.corpus)
    findings_dir.mkdir(parents=True, exist_ok=True)
    recovered = inflight_io.recover_inflight(findings_dir, backend)  # the case a killed session was running
    for r in recovered:
        if not r.finding:
            warnings.warn(StoppedCase(f"{fuzz_backend}: {r.message}"))
    space = Space.for_device(attnfuzz.device, attnfuzz.max_len)
    as_found = corpus_io.AsFound(fuzz_backend, attnfuzz.device, backend.version())
    try:
        with interrupt.interruptible():  # SIGINT / SIGTERM: pytest's "interrupted", the running case no finding
            tally, findings = fuzz(backend, device=attnfuzz.device, space=space, settings=settings,
                                   seed=attnfuzz.seed, worker=worker, on_case=as_found.see,
                                   known=corpus_io.known_bugs(corpus_io.shipped_dir(), findings_dir),
                                   inflight=inflight_io.inflight_path(findings_dir, backend.name),
                                   database_key=examples.key(backend, findings_dir))
    except interrupt.Interrupted:
        saved = as_found.save(findings_dir, corpus_io.STOPPED_UNCONFIRMED)
        capture = pytestconfig.pluginmanager.getplugin("capturemanager")   # None under -p no:capture
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            for _, said in saved:  # shown past the capture: an interrupted session prints no captured output
                print(f"{fuzz_backend}: saved as found before the stop: {said}", file=sys.stderr)
        raise
    finally:
        if worker is not None:
            worker.close()
    print(f"{fuzz_backend}: {tally.to_dict()}")
    lines = []
    for f in findings:
        entry = corpus_io.Entry(backend=fuzz_backend, case=f.case, verdict=f.verdict, device=attnfuzz.device,
                                backend_version=backend.version(), attached=f.attached)
        new = not (findings_dir / entry.filename).exists()
        lines.append(corpus_io.describe_saved(entry, corpus_io.save(findings_dir, entry), new=new))
    lines += [f"met before the shrunk finding, saved as found: {said}"  # --first-bug's other failures
              for _, said in as_found.besides(findings).save(findings_dir, corpus_io.MET_UNCONFIRMED)]
    lines += [r.message for r in recovered if r.finding]
    if lines:
        pytest.fail(f"{fuzz_backend}: {len(lines)} finding(s) in {tally.examples} examples\n" + "\n".join(lines),
                    pytrace=False)
    assert tally.examples > 0, f"{fuzz_backend}: no example ran"
