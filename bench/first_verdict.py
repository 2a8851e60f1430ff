"""Time to first verdict from a cold start: a fresh `attnfuzz run` process per backend (imports, CUDA start-up,
JIT compilation with an empty FA4 cache), timed until its first case is logged.

    python3 bench/first_verdict.py --device cuda sdpa-math sdpa-flash fa4 te-fused flex-compiled
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def first_verdict(backend: str, device: str, timeout: float) -> tuple[float | None, str]:
    """Seconds from spawning the process to its first logged verdict, and that verdict's label."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cases.jsonl"
        env = {**os.environ, "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(Path(tmp) / "fa4-cache")}
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "fuzz", "run", "--backend", backend, "--device", device,
                                 "--profile", "ci", "--max-examples", "5", "--corpus", str(Path(tmp) / "corpus"),
                                 "--log", str(log)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        try:
            while time.perf_counter() - start < timeout:
                if log.exists() and log.read_text().strip():
                    seconds = time.perf_counter() - start
                    label = json.loads(log.read_text().splitlines()[0])["label"]
                    return seconds, label
                if proc.poll() is not None:
                    return None, f"exited {proc.returncode} first: {proc.stderr.read()[-300:]}"
                time.sleep(0.02)
            return None, f"no verdict in {timeout:.0f}s"
        finally:
            proc.kill()
            proc.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("backends", nargs="+")
    p.add_argument("--device", default="cpu")
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args()
    for backend in args.backends:
        seconds, label = first_verdict(backend, args.device, args.timeout)
        shown = f"{seconds:.1f}s" if seconds is not None else "-"
        print(f"{backend}: first verdict after {shown} ({label})", flush=True)


if __name__ == "__main__":
    main()
