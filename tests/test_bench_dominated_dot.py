"""bench/dominated_dot.py on the CPU: a kernel that rounds to nearest stays within the grader's dominated-dot
allowance, a logit off by a few ulps of fp16 reads far above it, and a backend without an LSE is named."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from attnfuzz.backends import get
from attnfuzz.oracles.tolerance import dot_ulps
from attnfuzz.oracles.verdict import Output

SPEC = importlib.util.spec_from_file_location("dominated_dot", Path(__file__).resolve().parents[1] / "bench" /
                                              "dominated_dot.py")
dominated_dot = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(dominated_dot)


class LogitOff:
    """sdpa-flash with its LSE moved by 2^-10 of itself: an fp16 rounding of the logit."""

    def __init__(self):
        self.inner = get("sdpa-flash", "cpu")
        self.name = "logit-off"

    def unsupported(self, case):
        return self.inner.unsupported(case)

    def run(self, case, t):
        out = self.inner.run(case, t)
        return Output(out=out.out, lse=out.lse * (1 + 2.0**-10))


def test_round_to_nearest_stays_within_the_allowance_and_a_rounded_logit_does_not():
    d = 128
    allowed = 2 * max(1.0, d ** 0.5 / 2)   # the random walk alone: round to nearest needs no more
    assert max(dominated_dot.errors(get("sdpa-flash", "cpu"), "cpu", d, "float16", 4)) < allowed
    assert min(dominated_dot.errors(LogitOff(), "cpu", d, "float16", 4)) > 100 * 2 * dot_ulps(d, "float16")


def test_a_dominated_dot_is_allowed_a_random_walk_or_a_truncating_tensor_core_step_by_step():
    assert dot_ulps(0, "float16") == 1.0 and dot_ulps(64, "float32") == 4.0
    assert dot_ulps(512, "float32") == 512 ** 0.5 / 2      # round to nearest: a random walk
    assert dot_ulps(512, "bfloat16") == 32.0                # one truncated ulp per k-step of 16
    assert dot_ulps(64, "float16") == 4.0                   # where the two meet


def test_a_backend_without_an_lse_is_named():
    with pytest.raises(SystemExit, match="returns no LSE"):
        dominated_dot.errors(get("sdpa-math", "cpu"), "cpu", 16, "float16", 1)
