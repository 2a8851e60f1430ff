"""`attnfuzz report-bug ENTRY`: an issue-ready report, its case rerun through every backend that can run here.

Planted kernels (tests/misbehaving.py as the entry's backend, tests/broken.py registered beside the real backends)
make the verdicts known; the real CPU backends run too, their verdicts not asserted."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys

import pytest

from attnfuzz import backends
from attnfuzz.store import corpus as corpus_io
from attnfuzz.backends import get
from attnfuzz.cli import main
from attnfuzz.engine.harness import run_case
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.tools.bugreport import case_table, cross_table
from attnfuzz.tools.crosscheck import CANNOT, NOT_RUN, OVER_BUDGET, Row
from tests.broken import Correct, ZeroWhenCausal

ZERO = "tests.misbehaving:zero_when_causal"
CAUSAL = Case(b=1, sq=3, skv=3, h=2, hk=1, d_qk=8, d_v=8, dtype="float32", causal=True, seed=5)


def _planted(device):
    """Two planted kernels registered under their own names: one correct, one with the entry's bug."""
    return {"correct": lambda device: Correct(), "broken-zero-causal": lambda device: ZeroWhenCausal()}


def _register(monkeypatch, keep=None):
    """The real registry (or the names in `keep` of it) plus the planted kernels."""
    real = backends.factories()
    chosen = {n: f for n, f in real.items() if keep is None or n in keep}
    monkeypatch.setattr(backends, "factories", lambda: {**chosen, **_planted("cpu")})


def _report(tmp_path, path, *extra) -> str:
    out = tmp_path / "report.md"
    assert main(["report-bug", str(path), "--out", str(out), *extra]) == 0
    return out.read_text()


def _row(report: str, backend: str) -> str:
    [line] = [ln for ln in report.splitlines() if ln.startswith((f"| {backend} |", f"| **{backend}** |"))]
    return line


def _listed(report: str, backend: str) -> list[str]:
    """The lines under the cross-check table that name `backend` as one that did not run the case."""
    name = re.escape(backend)
    return [ln for ln in report.splitlines() if ln.startswith("- ") and re.search(rf"[:,;] {name}( |,|;|$)", ln)]


def _entry(tmp_path, backend, case, verdict, **fields):
    return corpus_io.save(tmp_path, corpus_io.Entry(backend, case, verdict, **fields))


@pytest.mark.slow
def test_report_has_the_repro_the_worst_element_and_a_row_per_backend_and_shows_the_disagreement(tmp_path, monkeypatch):
    verdict = run_case(get(ZERO, "cpu"), CAUSAL)
    assert verdict.label == "FAIL:ALL_ZERO"
    path = _entry(tmp_path, ZERO, CAUSAL, verdict)
    _register(monkeypatch)
    report = _report(tmp_path, path)

    assert report.startswith(f"# {ZERO} returns an all-zero output for causal (top-left) attention")
    assert path.with_suffix(".py").read_text().rstrip() in report, "the repro script inline, whole"
    w = verdict.worst
    assert f"| out | {list(w.index)} (batch, query, head, channel) | 0 | {w.expected:.4g} |" in report
    for name in backends.factories():  # once: a row of the table, or named in the line of its reason for not running
        rows = [ln for ln in report.splitlines() if ln.startswith((f"| {name} |", f"| **{name}** |"))]
        assert len(rows) + len(_listed(report, name)) == 1, name
    [line] = _listed(report, "ring-allgather")
    assert line.startswith("- not run: ") and "(context parallel" in line, line
    assert "**FAIL:ALL_ZERO**" in _row(report, ZERO)
    assert "| correct | default | - | PASS (" in report
    assert "**FAIL:ALL_ZERO**" in _row(report, "broken-zero-causal")
    assert "It reproduces here" in report
    assert "broken-zero-causal fails the same way (FAIL:ALL_ZERO)" in report
    summary = report.split("\n\n")[1]
    assert "correct" in summary.split("pass against the float64 oracle")[0], summary


def test_a_spelling_the_entrys_backend_passes_in_shows_up_beside_the_one_it_fails_in(tmp_path, monkeypatch):
    """sdpa-math, planted here to zero is_causal only: the causal spellings run side by side."""
    import attnfuzz.backends.sdpa.adapter as sdpa

    class ZeroIsCausal(sdpa.SdpaBackend):
        def run(self, case, tensors):
            output = super().run(case, tensors)
            if self._resolve(case).mask == "is_causal":
                output.out = output.out * 0
            return output

    monkeypatch.setattr(backends, "factories", lambda: {"sdpa-math": lambda device: ZeroIsCausal("sdpa-math", device),
                                                        **_planted("cpu")})
    case = CAUSAL.replace(h=1, spelling="is_causal")
    path = _entry(tmp_path, "sdpa-math", case, run_case(ZeroIsCausal("sdpa-math", "cpu"), case))
    report = _report(tmp_path, path)
    rows = [ln for ln in report.splitlines() if ln.startswith("| **sdpa-math** |")]
    assert "| is_causal |" in rows[0] and "**FAIL:ALL_ZERO**" in rows[0], "the entry's spelling first"
    assert any("| causal_upper_left |" in r and "PASS" in r for r in rows)
    assert not any("| default" in r for r in rows), "the default is is_causal again: not run twice"
    # every form of is_causal fails (an explicit scale, through MultiheadAttention), every other spelling passes
    assert "Of sdpa-math's spellings, is_causal, is_causal+explicit_scale and is_causal+mha_batch_first fail and " \
           "causal_upper_left, " in report


def test_control_the_entrys_backend_now_passes(tmp_path, monkeypatch):
    """Saved as an all-zero failure, but the case is not causal: the kernel passes it, and the report says so."""
    plain = CAUSAL.replace(causal=False)
    saved = V.Verdict(V.FAIL, V.ALL_ZERO, "every graded output element is 0", V.Worst("out", (0, 1, 0, 2), 0.0, 0.75),
                      math.inf)
    path = _entry(tmp_path, ZERO, plain, saved)
    _register(monkeypatch, keep=())
    report = _report(tmp_path, path)
    assert "It no longer reproduces here" in report
    assert "PASS" in _row(report, ZERO)
    assert "It reproduces here" not in report


def test_an_entry_whose_backend_cannot_run_here_still_gets_everything_else(tmp_path, monkeypatch):
    """A TransformerEngine entry found on an H200, reported on this CPU machine."""
    case = CAUSAL.replace(dtype="float16", alignment="bottom_right", h=1)
    saved = V.Verdict(V.FAIL, V.ALL_ZERO, "every graded output element is 0; the oracle's largest is 1.5",
                      V.Worst("out", (0, 0, 0, 3), 0.0, -1.5), math.inf)
    env = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0", "python": "3.12.3"}
    path = _entry(tmp_path, "te-flash", case, saved, device="cuda", backend_version="2.20.2", environment=env,
                  known_bug={"link": "https://example.org/te/issues/1", "note": "the -1 sentinel"})
    _register(monkeypatch, keep=("te-flash", "sdpa-math"))
    report = _report(tmp_path, path, "--device", "cpu")
    assert "te-flash cannot run on this machine" in report
    assert "cannot run here: TransformerEngine" in _row(report, "te-flash")
    assert "| when found (NVIDIA H200) | out | [0, 0, 0, 3]" in report
    assert "| GPU | NVIDIA H200 |" in report and "| TransformerEngine | 2.20.2 |" in report
    assert "Tracked at https://example.org/te/issues/1: the -1 sentinel" in report
    assert "| correct | default | - | PASS (" in report, "the other backends still ran on the same case"
    assert path.with_suffix(".py").read_text().rstrip() in report
    assert "needs only torch and TransformerEngine, and a CUDA device" in report


def test_a_crashed_entry_runs_its_backend_in_a_worker_without_being_asked(tmp_path, monkeypatch):
    crash = V.Verdict(V.CRASH, "SIGSEGV", "the worker process died (SIGSEGV) while running this case")
    path = _entry(tmp_path, "tests.misbehaving:segfault_when_causal", CAUSAL, crash)
    _register(monkeypatch, keep=())
    report = _report(tmp_path, path, "--case-timeout", "60")
    assert "**CRASH:SIGSEGV**" in _row(report, "tests.misbehaving:segfault_when_causal")
    assert "It reproduces here" in report and "No element to compare" in report
    assert "| correct | default | - | PASS (" in report


@pytest.mark.parametrize("content", [None, '{"backend": "x"}', "not json at all", "[1, 2]"])
def test_bad_input_exits_2_naming_the_file(tmp_path, capsys, content):
    path = tmp_path / "entry.json"
    if content is not None:
        path.write_text(content)
    assert main(["report-bug", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "report-bug" in err


def test_a_cuda_device_on_a_machine_without_one_exits_2(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    path = _entry(tmp_path, ZERO, CAUSAL, V.Verdict(V.FAIL, V.ALL_ZERO))
    assert main(["report-bug", str(path), "--device", "cuda"]) == 2
    assert "--device='cuda'" in capsys.readouterr().err
    assert json.loads(path.read_text())["backend"] == ZERO


def test_an_entry_found_on_another_device_is_not_said_to_reproduce_there(tmp_path, monkeypatch):
    """The CPU runs another kernel than the GPU the entry was found on: the same failure is reported as such."""
    path = _entry(tmp_path, ZERO, CAUSAL, run_case(get(ZERO, "cpu"), CAUSAL), device="cuda")
    _register(monkeypatch, keep=())
    report = _report(tmp_path, path, "--device", "cpu")
    assert "Here on cpu (it was found on cuda: another kernel)" in report
    assert "It reproduces here" not in report


KERNEL = """import torch


def zeros_when_causal(q, k, v, *, causal, window, bottom_right, scale):
    if causal:
        return torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    k, v = (x.repeat_interleave(q.shape[2] // x.shape[2], dim=2) for x in (k, v))
    weights = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", weights, v.float()).to(q.dtype)
"""


def test_a_report_on_your_own_kernel_names_no_folder_of_this_machine(tmp_path, monkeypatch):
    """A kernel in ~/proj/mykernels_here/attn.py, run from ~/proj, its finding saved outside the home folder: the
    report names the kernel module:function and files by name, a path in a message relative to the current folder
    or under ~; the repro script in it runs from the kernel's folder and fails there while the bug is."""
    home = tmp_path / "home"
    proj = home / "proj"
    (proj / "mykernels_here").mkdir(parents=True)
    (proj / "mykernels_here" / "__init__.py").write_text("")
    (proj / "mykernels_here" / "attn.py").write_text(KERNEL)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(proj)
    monkeypatch.syspath_prepend(str(proj))
    spec = "mykernels_here.attn:zeros_when_causal"
    verdict = run_case(get(spec), CAUSAL)
    assert verdict.label == "FAIL:ALL_ZERO", verdict
    verdict = dataclasses.replace(verdict, checks=(f"cached at {proj}/cache/k.bin", f"logged to {home}/logs/a.log"))
    path = _entry(tmp_path / "findings", spec, CAUSAL, verdict)
    _register(monkeypatch, keep=())
    report = _report(tmp_path, path)
    for folder in (tmp_path, home, proj):
        assert str(folder) not in report, folder
    assert report.startswith(f"# {spec} returns an all-zero output")
    assert "`cached at ./cache/k.bin`" in report and "`logged to ~/logs/a.log`" in report
    assert "run it from the folder where `import mykernels_here.attn` works" in report
    assert path.with_suffix(".py").read_text().rstrip() in report, "the script beside the entry, inline, whole"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run([sys.executable, str(path.with_suffix(".py"))], cwd=proj, env=env, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 1 and "all-zero output" in ran.stdout, ran.stdout + ran.stderr


def test_a_script_that_names_the_kernels_folder_is_written_anew_for_the_report(tmp_path, monkeypatch):
    """An older attnfuzz wrote the folder the kernel was imported from into the script (KERNEL_PATH): the report
    carries a script written now instead, which names none."""
    verdict = run_case(get(ZERO, "cpu"), CAUSAL)
    path = _entry(tmp_path, ZERO, CAUSAL, verdict)
    old = path.with_suffix(".py")
    old.write_text(old.read_text().replace("\n\nKERNEL_MODULE = ",
                                           "\n\nKERNEL_PATH = '/srv/me/kernels'\nKERNEL_MODULE = "))
    _register(monkeypatch, keep=())
    report = _report(tmp_path, path)
    assert "/srv/me/kernels" not in report and "KERNEL_PATH" not in report
    assert "(written now: the one beside the entry names a folder)" in report


def test_backends_that_did_not_run_the_case_fold_into_a_line_per_reason():
    """The table keeps the backends that ran (and the entry's own, whatever it did); the others are one line per
    kind of reason, a backend's own reason beside it, shared by backends that give the same one."""
    passed = V.Verdict(V.PASS, ratio=0.5)
    refused = V.Verdict(V.UNSUPPORTED, None, "no GQA")
    rows = [Row("mine", "default", V.UNSUPPORTED, "no float64 path", "1.0", V.Verdict(V.UNSUPPORTED), own=True),
            Row("sdpa-math", "default", V.PASS, "", "2.13", passed),
            Row("fa4", "-", CANNOT, "flash-attn-4 is not installed", "not installed"),
            Row("te-flash", "-", CANNOT, "TransformerEngine does not import", "not installed"),
            Row("sdpa-cudnn", "-", CANNOT, "sdpa-cudnn needs CUDA", "2.13"),
            Row("sdpa-flash", "default", V.UNSUPPORTED, "no GQA", "2.13", refused),
            Row("flex-eager", "default", V.UNSUPPORTED, "no GQA", "2.13", refused),
            Row("flex-paged", "default", V.UNSUPPORTED, "needs page_size", "2.13", refused),
            Row("ring-allgather", "-", NOT_RUN, "context parallel"),
            Row("ring-alltoall", "-", NOT_RUN, "context parallel"),
            Row("flex-compiled", "-", OVER_BUDGET, "cut off after 10 s"),
            Row("mine", "a, b", OVER_BUDGET, "the 30 s were spent", own=True)]
    text = "\n".join(cross_table(rows, "cpu", ""))
    table = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| backend")]
    assert [ln.split(" | ")[0] for ln in table] == ["| **mine**", "| sdpa-math", "| **mine**"], table
    assert "| a, b | - | not run: over the time budget: the 30 s were spent |" in table[-1]
    assert [ln for ln in text.splitlines() if ln.startswith("- ")] == [
        "- not run: not installed: fa4 (flash-attn-4 is not installed); te-flash (TransformerEngine does not import)",
        "- not run: cannot run on cpu: sdpa-cudnn (needs CUDA)",
        "- not run: cannot take the case: sdpa-flash, flex-eager (no GQA); flex-paged (needs page_size)",
        "- not run: ring-allgather, ring-alltoall (context parallel)",
        "- not run: over the time budget: flex-compiled (cut off after 10 s)"]


def test_the_case_table_shows_every_field_set_whatever_it_is():
    """The value family, a paged cache, storage: every field off its default, read from the Case dataclass, so a
    field Case gains shows up too."""
    case = Case(b=2, sq=8, skv=8, d_qk=8, d_v=8, values="outlier_channel", page_size=4, shared_prefix_pages=1, seed=3)
    table = case_table(case)
    for field in ("b=2", "sq=8", "values='outlier_channel'", "page_size=4", "shared_prefix_pages=1", "seed=3"):
        assert f"`{field}`" in table, field
    assert "`storage=" not in table and "`dtype=" not in table, "fields at their defaults are not listed"
    assert "`storage=('offset', 'plain', 'plain')`" in case_table(Case(storage=("offset", "plain", "plain")))

    @dataclasses.dataclass(frozen=True)
    class Wider(Case):
        tile: int = 0

    assert "`tile=64`" in case_table(Wider(tile=64))


def test_an_lse_findings_report_says_its_script_checks_the_lse(tmp_path, monkeypatch):
    """The script of an LSE finding checks the LSE (tests/test_repro_lse.py runs it): the report says so, and not
    that it exits 0 while the bug is there; a script whose call returns no LSE still gets the warning."""
    spec = "tests.lse_kernels:lse_in_base_2"
    case = Case(b=2, sq=5, skv=7, h=2, d_qk=8, d_v=8, dtype="float32", seed=3)
    verdict = run_case(get(spec), case)
    assert verdict.label == "FAIL:LSE", verdict
    path = _entry(tmp_path, spec, case, verdict)
    _register(monkeypatch, keep=())
    report = _report(tmp_path, path)
    assert "checks the output, the LSE against them" in report and "does not check the LSE" not in report
    script = path.with_suffix(".py")
    script.write_text(script.read_text().replace("through attnfuzz's adapter", "through the kernel"))
    assert "**The script does not check the LSE**" in _report(tmp_path, path)
