"""bench/worker_restart.py on the CPU: the case after a crash is timed apart from a warm one, with spares and without."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_it_prints_the_warm_case_and_the_case_after_a_crash_with_and_without_spares():
    ran = subprocess.run([sys.executable, str(REPO / "bench" / "worker_restart.py"), "--rounds", "2"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert ran.returncode == 0, ran.stderr[-2000:]
    lines = ran.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["cpu spares=4", "cpu spares=0"]
    assert all("warm case" in line and "case after a crash" in line for line in lines)
