"""bench/gpu_stalls.py on synthetic case logs: a moment when most lanes sit in one slow case is a stall, the fault
that ran beside it is named, and slow cases of one lane alone, or a fault the skip answered, are not."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("gpu_stalls", REPO / "bench" / "gpu_stalls.py")
gpu_stalls = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_stalls)

FAULT = {"status": "KNOWN", "diagnosis": "AcceleratorError"}


def _row(lane, end, seconds, label="PASS", verdict=None, message="", backend="sdpa-math"):
    return {"backend": backend, "label": label, "message": message, "seconds": seconds, "time": end, "lane": lane,
            "verdict": verdict or {"status": label, "diagnosis": None}}


def _log(stalled: bool) -> list[dict]:
    rows = [_row(lane, t / 10, 0.05) for lane in range(5) for t in range(1, 100)]   # small cases, every lane
    rows.append(_row(0, 26.0, 6.0, "KNOWN:AcceleratorError", FAULT, "AcceleratorError: misaligned address",
                     "sdpa-flash"))
    others = range(1, 5) if stalled else range(1, 2)
    rows += [_row(lane, 25.8, 5.9) for lane in others]
    rows.append(_row(2, 60.0, 0.01, "KNOWN:AcceleratorError", FAULT, "not run: known bug x takes this case",
                     "sdpa-flash"))
    return rows


def test_a_moment_most_lanes_share_is_a_stall_and_the_fault_beside_it_is_named():
    s = gpu_stalls.summary(_log(stalled=True))
    assert s["stalls"] == 1 and 5.5 <= s["stalled_s"] <= 6.1 and s["stalls_without_a_crash"] == 0
    assert s["crashes_near_a_stall"] == {"sdpa-flash KNOWN:AcceleratorError AcceleratorError: misaligned address": 1}
    assert s["crashes_apart"] == {}, "a case the skip answered did not run: no crash"


def test_two_slow_lanes_of_five_are_no_stall():
    s = gpu_stalls.summary(_log(stalled=False))
    assert s["stalls"] == 0 and s["stalled_s"] == 0 and sum(s["crashes_apart"].values()) == 1


def test_the_command_reads_a_campaign_folder(tmp_path):
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "lane0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _log(stalled=True)))
    ran = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_stalls.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert "1 stalls" in ran.stdout and "crashes beside a stall: 1" in ran.stdout
    empty = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_stalls.py"), str(tmp_path / "cases" / "none")],
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "no campaign case logs" in empty.stderr
