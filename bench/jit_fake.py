"""A stand-in JIT backend for CPU measurements of compile-aware search: a correct CPU attention (bench/planted.py's
trusted kernel) behind FA4's capability table and compile key, which pays a simulated compile for every compile key
it has not met before (counted, and slept for when `sleep` is set), and may carry one planted bug in one kernel
configuration.

    FakeJit(compile_seconds=2.0)               correct; 2 s per new configuration (FA4: 1.6-3 s)
    FakeJit(bug="config")                      output x 1.125 on bfloat16 + softcap + causal cases (every case of
                                               those configurations)
    FakeJit(bug="config-long")                 the same, on those cases with more than 64 keys only (a second key
                                               tile: the configuration's first case may pass)
    FakeJit(bug="build")                       bfloat16 + softcap + causal kernels fail to build (CRASH:
                                               CompilerDiagnosticError), and a failed build is not cached: every
                                               call of such a configuration pays the compile again, as FA4's do
    FakeJit(bug="build-long")                  the same past 64 keys only: a build the compile key does not tell
                                               apart (a key that misses what the kernel is built for)
    Verdicts(FakeJit(...))                     a worker answering from the planted bug alone, without the oracle
"""

from __future__ import annotations

import time

from attnfuzz.backends.base import Backend, first_reason
from attnfuzz.backends.custom import load_custom
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

BUGS = ("none", "config", "config-long", "build", "build-long")


class CompilerDiagnosticError(Exception):
    """Named as the CuTe DSL's error for a kernel that fails to build (FlashAttn4.build_errors)."""


def buggy(case: Case, bug: str) -> bool:
    """Whether the planted bug changes this case's output (or, for a build bug, fails its build)."""
    if bug == "none" or not (case.dtype == "bfloat16" and case.softcap is not None and case.causal):
        return False
    return bug in ("config", "build") or case.skv > 64


def fails_to_build(case: Case, bug: str) -> bool:
    return bug.startswith("build") and buggy(case, bug)


def fa4_like_key(case: Case) -> tuple:
    """FA4's compile key (fuzz/backends/flash/fa4.py) without the spelling and the architecture: one call for every
    layout."""
    return (case.dtype, case.d_qk, case.d_v, case.h // case.hk, case.causal, case.left is not None,
            case.right is not None and not case.causal, case.softcap is not None, case.softmax != "vanilla",
            case.padded, case.grads)


class FakeJit(Backend):
    name = "fake-jit"
    family = "default"
    build_errors = ("CompilerDiagnosticError",)

    def __init__(self, compile_seconds: float = 2.0, sleep: bool = False, bug: str = "none", device: str = "cpu"):
        if bug not in BUGS:
            raise ValueError(f"FakeJit: invalid bug={bug!r}: one of {BUGS}")
        self.device, self.compile_seconds, self.sleep, self.bug = device, compile_seconds, sleep, bug
        self.inner = load_custom("bench.planted:correct", device)
        self.compiled: set[tuple] = set()
        self.compile_spent = 0.0    # simulated seconds of compilation so far
        self.runs = 0
        self.failed_builds = 0      # calls whose build failed (each compiled again)

    def unsupported(self, case: Case) -> str | None:
        return first_reason(
            (case.dtype not in ("float16", "bfloat16"), "float16 / bfloat16 only"),
            (not (8 <= case.d_qk <= 256 and 8 <= case.d_v <= 256) or case.d_qk % 8 or case.d_v % 8,
             "head dims 8..256, multiples of 8"),
            (case.mask_density is not None, "no explicit mask"),
            (case.alibi_slopes is not None, "no ALiBi"),
        ) or self.inner.unsupported(case)

    def compile_key(self, case: Case) -> tuple:
        return fa4_like_key(case)

    def compile(self, case: Case) -> None:
        """Count (and with `sleep`, sleep) a compile if the case's key is new, or its build fails (then raise)."""
        self.runs += 1
        key = self.compile_key(case)
        failing = fails_to_build(case, self.bug)
        if key not in self.compiled or failing:
            if not failing:
                self.compiled.add(key)
            self.compile_spent += self.compile_seconds
            if self.sleep:
                time.sleep(self.compile_seconds)
        if failing:
            self.failed_builds += 1
            raise CompilerDiagnosticError("planted: the kernel does not build")

    def run(self, case, tensors):
        self.compile(case)
        output = self.inner.run(case, tensors)
        if buggy(case, self.bug):
            output.out = output.out * 1.125
        return output


class Verdicts:
    """A worker (anything with run(case) -> Verdict, as the harness takes) that grades nothing: FakeJit's refusals
    and compiles, then FAIL where its planted bug changes the output, else PASS. Searches and shrinks in seconds."""

    def __init__(self, backend: FakeJit):
        self.backend = backend

    def run(self, case: Case) -> V.Verdict:
        reason = self.backend.unsupported(case)
        if reason is not None:
            return V.Verdict(V.UNSUPPORTED, None, reason)
        try:
            self.backend.compile(case)
        except CompilerDiagnosticError as e:
            return V.Verdict(V.CRASH, type(e).__name__, f"{type(e).__name__}: {e}")
        if buggy(case, self.backend.bug):
            return V.Verdict(V.FAIL, V.TOLERANCE, "planted", ratio=2.0)
        return V.Verdict(V.PASS, None, "", ratio=0.5)
