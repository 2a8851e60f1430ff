"""Time to first verdict from a cold start: a fresh `attnfuzz run` process per backend (imports, CUDA start-up,
JIT compilation with an empty FA4 cache), timed until its first case is logged, and until its first graded case
(a backend's first drawn cases may be ones it refuses: UNSUPPORTED is a verdict, not a grade).

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


def first_verdict(backend: str, device: str, timeout: float) -> tuple[float | None, str, float | None]:
    """Seconds from spawning the process to its first logged verdict, that verdict's label, and seconds to the
    first graded verdict (None if none came within the timeout)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cases.jsonl"
        env = {**os.environ, "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(Path(tmp) / "fa4-cache")}
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "attnfuzz", "run", "--backend", backend, "--device", device,
                                 "--profile", "ci", "--max-examples", "200", "--corpus", str(Path(tmp) / "corpus"),
                                 "--log", str(log)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        first, label = None, f"no verdict in {timeout:.0f}s"
        try:
            while time.perf_counter() - start < timeout:
                lines = log.read_text().splitlines() if log.exists() else []
                labels = [json.loads(line)["label"] for line in lines if line.endswith("}")]
                if labels and first is None:
                    first, label = time.perf_counter() - start, labels[0]
                if any(not x.startswith("UNSUPPORTED") for x in labels):
                    return first, label, time.perf_counter() - start
                if proc.poll() is not None:
                    return first, label if first else f"exited {proc.returncode}: {proc.stderr.read()[-300:]}", None
                time.sleep(0.02)
            return first, label, None
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
        seconds, label, graded = first_verdict(backend, args.device, args.timeout)
        shown = f"{seconds:.1f}s" if seconds is not None else "-"
        shown_graded = f"{graded:.1f}s" if graded is not None else "none in the timeout"
        print(f"{backend}: first verdict after {shown} ({label}), first graded after {shown_graded}", flush=True)


if __name__ == "__main__":
    main()
