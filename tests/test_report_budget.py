"""`attnfuzz report-bug`'s cross-check runs only the backends that can take the case, imports a library once for the
backends that share it, and keeps to its time budget, naming every backend it left out and why.

The backends here are planted (tests/broken.py's Correct, whose verdicts are known), registered alone; the libraries
they import are modules written for the test, each import of which leaves a line in a file."""

from __future__ import annotations

import importlib
import sys
import time
import uuid

from attnfuzz import backends
from attnfuzz.backends import get
from attnfuzz.cli import main
from attnfuzz.engine.harness import run_case
from attnfuzz.store import corpus as corpus_io
from attnfuzz.strategies.case import Case
from tests.broken import Correct
from tests.misbehaving import zero_when_causal

ZERO = "tests.misbehaving:zero_when_causal"  # the entry's backend: it fails causal cases, at once
CAUSAL = Case(b=1, sq=3, skv=3, h=2, hk=1, d_qk=8, d_v=8, dtype="float32", causal=True, seed=5)


class Planted(Correct):
    """A correct backend that imports `library_module` as the adapters import theirs (load(), then available()), and
    writes each call of run() to `calls`."""

    def __init__(self, name: str, library_module: str = "", calls: list | None = None, sleep_s: float = 0.0):
        self.name, self.library_module, self.calls, self.sleep_s = name, library_module, calls, sleep_s

    def load(self):
        try:
            importlib.import_module(self.library_module)
        except ImportError as e:
            return f"{self.library_module} does not load ({e})"
        return None

    def available(self):
        return self.load() if self.library_module else None

    def run(self, case, t):
        if self.calls is not None:
            self.calls.append(self.name)
        time.sleep(self.sleep_s)  # a kernel that compiles for that long first
        return super().run(case, t)


class Refuses(Planted):
    def unsupported(self, case):
        return "no causal case: the kernel has no mask"

    def available(self):
        self.calls.append(f"{self.name}.available")
        return super().available()


def _library(tmp_path, monkeypatch, *, loads: bool) -> tuple[str, object]:
    """A module on the path that counts its imports in a file, and raises ImportError unless it `loads`."""
    name = f"kernels_{uuid.uuid4().hex[:12]}"
    log = tmp_path / f"{name}.imports"
    fail = "" if loads else "raise ImportError('libkernels.so: cannot open shared object file')\n"
    (tmp_path / f"{name}.py").write_text(f"with open({str(log)!r}, 'a') as f:\n    f.write('imported\\n')\n{fail}")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name, lambda: len(log.read_text().splitlines()) if log.exists() else 0


def zero_after_a_while(q, k, v, *, causal, window, bottom_right, scale):
    """ZERO's kernel, answering after 0.2 s."""
    time.sleep(0.2)
    return zero_when_causal(q, k, v, causal=causal, window=window, bottom_right=bottom_right, scale=scale)


def _report(tmp_path, monkeypatch, planted: dict, *options, own: str = ZERO) -> str:
    """The report of a failing entry of `own`, with the planted backends registered alone."""
    monkeypatch.setattr(backends, "factories", lambda: {name: (lambda device, b=b: b) for name, b in planted.items()})
    path = corpus_io.save(tmp_path, corpus_io.Entry(own, CAUSAL, run_case(get(own, "cpu"), CAUSAL)))
    out = tmp_path / "report.md"
    assert main(["report-bug", str(path), "--out", str(out), *options]) == 0
    return out.read_text()


def _lines(report: str) -> list[str]:
    return [ln for ln in report.splitlines() if ln.startswith("- not run")]


def test_a_slow_backend_is_cut_off_at_its_limit_and_the_next_one_still_runs(tmp_path, monkeypatch):
    calls: list[str] = []
    planted = {"slow": Planted("slow", calls=calls, sleep_s=60), "after": Planted("after", calls=calls)}
    start = time.monotonic()
    report = _report(tmp_path, monkeypatch, planted, "--backend-limit", "0.5")
    assert time.monotonic() - start < 30, "cut off at 0.5 s, not after its 60 s"
    assert calls == ["slow", "after"]
    assert _lines(report) == ["- not run: over the time budget: slow (cut off after 0.5 s, the most one backend may "
                              "take (--backend-limit))"]
    assert "| after | default | - | PASS (" in report


def test_once_the_budget_is_spent_no_backend_starts(tmp_path, monkeypatch):
    calls: list[str] = []
    planted = {"slow": Planted("slow", calls=calls, sleep_s=60), "later": Planted("later", calls=calls)}
    start = time.monotonic()
    report = _report(tmp_path, monkeypatch, planted, "--budget", "1", "--backend-limit", "100")
    assert time.monotonic() - start < 30
    assert calls == ["slow"], "the one after the budget ran out never ran"
    assert _lines(report) == ["- not run: over the time budget: slow, later (the cross-check's 1 s were spent "
                              "(--budget))"]
    assert "It reproduces here" in report, "the entry's own backend ran its spelling"


def test_the_entrys_own_spelling_runs_whatever_the_budget_and_nothing_else_starts(tmp_path, monkeypatch):
    calls: list[str] = []
    slow = "tests.test_report_budget:zero_after_a_while"
    report = _report(tmp_path, monkeypatch, {"later": Planted("later", calls=calls)}, "--budget", "0.01", own=slow)
    own = [ln for ln in report.splitlines() if ln.startswith(f"| **{slow}** |")]
    assert len(own) == 1 and "**FAIL:ALL_ZERO**" in own[0], own
    assert "It reproduces here" in report
    assert calls == [] and _lines(report) == ["- not run: over the time budget: later (the cross-check's 0.01 s were "
                                              "spent (--budget))"]


def test_a_backend_over_its_limit_in_an_import_is_cut_off_after_the_import_not_in_it(tmp_path, monkeypatch):
    """A module cut half-way through its import would be left half-built for every backend after it (as torch._dynamo
    was, and every torch.compile after it crashed): the import finishes, then the backend is cut off."""
    name = f"slow_import_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text("import time\ntime.sleep(1.5)\nREADY = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class ImportsFirst(Planted):
        def run(self, case, t):
            importlib.import_module(name)
            return super().run(case, t)

    report = _report(tmp_path, monkeypatch, {"late": ImportsFirst("late", sleep_s=60)}, "--backend-limit", "0.3")
    assert getattr(sys.modules.get(name), "READY", False), "the import ran to its end"
    assert _lines(report) == ["- not run: over the time budget: late (cut off after 0.3 s, the most one backend may "
                              "take (--backend-limit))"]


def test_a_backend_that_refuses_the_case_is_not_run_nor_its_library_imported(tmp_path, monkeypatch):
    library, imports = _library(tmp_path, monkeypatch, loads=True)
    calls: list[str] = []
    planted = {"maskless": Refuses("maskless", library, calls), "correct": Planted("correct")}
    report = _report(tmp_path, monkeypatch, planted)
    assert calls == [] and imports() == 0, "neither asked whether it can run, nor imported, nor run"
    assert _lines(report) == ["- not run: cannot take the case: maskless (no causal case: the kernel has no mask)"]
    assert "| correct | default | - | PASS (" in report


def test_a_family_sharing_a_library_that_does_not_load_imports_it_once(tmp_path, monkeypatch):
    library, imports = _library(tmp_path, monkeypatch, loads=False)
    calls: list[str] = []
    planted = {name: Planted(name, library, calls) for name in ("fam-a", "fam-b", "fam-c")}
    report = _report(tmp_path, monkeypatch, planted)
    assert imports() == 1 and calls == []
    assert _lines(report) == [f"- not run: not installed: fam-a, fam-b, fam-c ({library} does not load (libkernels.so: "
                              f"cannot open shared object file))"]


def test_control_a_family_whose_library_loads_runs_every_backend(tmp_path, monkeypatch):
    library, imports = _library(tmp_path, monkeypatch, loads=True)
    calls: list[str] = []
    planted = {name: Planted(name, library, calls) for name in ("fam-a", "fam-b")}
    report = _report(tmp_path, monkeypatch, planted)
    assert imports() == 1 and calls == ["fam-a", "fam-b"]
    assert "| fam-a | default | - | PASS (" in report and "| fam-b | default | - | PASS (" in report
    assert _lines(report) == []
