"""A fuzz run on a GPU isolates its backends unless told not to: a kernel's fault leaves the process's CUDA context
broken for every case after it, which ended in-process runs. On the CPU nothing changes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnfuzz.cli import _parser
from attnfuzz.engine.options import isolating


@pytest.mark.parametrize("device, isolate, no_isolate, expected", [
    ("cuda", False, False, True), ("cuda:1", False, False, True), ("cuda", False, True, False),
    ("cpu", False, False, False), ("cpu", True, False, True), ("cuda", True, False, True)])
def test_gpu_runs_are_isolated_by_default_and_cpu_runs_are_not(device, isolate, no_isolate, expected):
    assert isolating(device, isolate, no_isolate) is expected


def test_run_takes_no_isolate():
    args = _parser().parse_args(["run", "--device", "cuda", "--no-isolate"])
    assert args.no_isolate and not args.isolate
    assert not _parser().parse_args(["run"]).no_isolate


def test_the_pytest_plugin_takes_no_isolate(tmp_path):
    (tmp_path / "test_options.py").write_text("def test_options(pytestconfig):\n"
                                              "    assert pytestconfig.getoption('attnfuzz_no_isolate') is True\n")
    ran = subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-q", "-p", "no:cacheprovider",
                          "--attnfuzz-no-isolate"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
