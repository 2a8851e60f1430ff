"""What a backend hands back (Output) and what the grader says of it (Verdict)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

PASS, FAIL, UNSUPPORTED, CRASH, HANG, FLAKY = "PASS", "FAIL", "UNSUPPORTED", "CRASH", "HANG", "FLAKY"
KNOWN = "KNOWN"  # a failure matching a known bug of the corpus: reported, not raised, so the search goes on
# Not a run's verdict: what a stopped-case record (corpus/.stopped/) says of the case a run was stopped on, with
# nothing to show that the case ended it (attnfuzz.store.inflight.recover_inflight). Never a finding.
STOPPED = "STOPPED"
STATUSES = (PASS, FAIL, UNSUPPORTED, CRASH, HANG, FLAKY, KNOWN)
FAILED = (FAIL, CRASH, HANG, FLAKY)  # a finding, unless a known bug takes it

# Diagnoses, most specific first. Each FAIL carries exactly one.
SHAPE = "SHAPE"                        # out, the LSE or a gradient came back in another shape than the contract's
ALL_ZERO = "ALL_ZERO"                  # the output is all zeros where the oracle's is not
NONFINITE = "NONFINITE"                # NaN or inf in the output where the oracle is finite
EMPTY_ROWS = "EMPTY_ROWS"              # wrong only on rows that see no key (they must be 0; e.g. mean(V) instead)
MASK_ALIGNMENT = "MASK_ALIGNMENT"      # the output matches the other diagonal alignment
MASK_IGNORED = "MASK_IGNORED"          # the output matches no causal mask / window at all: the band never applied
WINDOW_OFF_BY_ONE = "WINDOW_OFF_BY_ONE"  # the output matches a window with one bound moved by one
MASK_LEAK = "MASK_LEAK"                # a probe row counted a key it must not see (one past a band edge, padding)
MASK_DROP = "MASK_DROP"                # a probe row lost a key it sees
GQA_MAPPING = "GQA_MAPPING"            # the output matches query head i reading KV head i % hk
SCALE = "SCALE"                        # the output matches another softmax scale
FP8_SCALE = "FP8_SCALE"                # the output matches an FP8 descale (q, k, v, output) applied twice or missing
LSE = "LSE"                            # the output passes, the log-sum-exp does not
GRADIENT = "GRADIENT"                  # the output passes, a gradient does not
TOLERANCE = "TOLERANCE"                # wrong beyond the bound, and no alternative reference explains it
NONDETERMINISTIC = "NONDETERMINISTIC"  # graded fine, but a backend that claims determinism differs bitwise on a rerun
BATCH_VARIANT = "BATCH_VARIANT"        # graded fine, but a backend that claims batch invariance gives a sequence other
                                       # bits alone (or in another batch order) than inside its batch
CUDA_ILLEGAL_ADDRESS = "CUDA_ILLEGAL_ADDRESS"  # a crash whose message is CUDA error 700, whatever exception carried it
DIAGNOSES = (SHAPE, ALL_ZERO, NONFINITE, EMPTY_ROWS, MASK_ALIGNMENT, MASK_IGNORED, WINDOW_OFF_BY_ONE, MASK_LEAK,
             MASK_DROP, GQA_MAPPING, SCALE, FP8_SCALE, LSE, GRADIENT, TOLERANCE, NONDETERMINISTIC, BATCH_VARIANT)
# The diagnoses that name an alternative reference the failing output matches (oracles/grade.py alternatives): one
# output can match several, and then a verdict lists the others in `also`; so does an EMPTY_ROWS verdict, which is
# decided first, with every alternative its output matches.
ALTERNATIVE = (MASK_ALIGNMENT, WINDOW_OFF_BY_ONE, MASK_IGNORED, GQA_MAPPING, SCALE, FP8_SCALE)


@dataclass
class Output:
    """A backend's result in logical shapes: out [b, sq, h, d_v]; lse [b, h, sq] in natural log, or None when the
    backend does not give it; grads in the shapes of q, k, v, or None. `ran` names what actually executed (a kernel,
    a TE backend), as the backend reports it."""

    out: torch.Tensor
    lse: torch.Tensor | None = None
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None
    ran: str = ""


@dataclass(frozen=True)
class Worst:
    """The element that is furthest off: which tensor, its index, the backend's value and the oracle's."""

    tensor: str
    index: tuple[int, ...]
    got: float
    expected: float

    def to_dict(self) -> dict:
        return {"tensor": self.tensor, "index": list(self.index), "got": self.got, "expected": self.expected}


@dataclass(frozen=True)
class Verdict:
    """The grade of one run. `ratio` is the worst error over its bound (PASS means <= 1): what the search climbs.
    `also`: the other ALTERNATIVE diagnoses whose references the same failing output matches (the diagnosis is the
    first that does, in the grader's order), so a finding can tell that another one's diagnosis explains it too.
    `batch_invariant`: whether the case's batch check (attnfuzz.engine.batch) found the backend's bits the same alone
    and in the batch; None where the case was not checked. `known_entry`: on a KNOWN verdict, the id (file stem) of
    the corpus entry whose known bug took the failure."""

    status: str
    diagnosis: str | None = None
    message: str = ""
    worst: Worst | None = None
    ratio: float = 0.0
    checks: tuple[str, ...] = field(default=())
    also: tuple[str, ...] = field(default=())
    batch_invariant: bool | None = None
    known_entry: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in FAILED

    @property
    def label(self) -> str:
        return f"{self.status}:{self.diagnosis}" if self.diagnosis else self.status

    def to_dict(self) -> dict:
        return {"status": self.status, "diagnosis": self.diagnosis, "message": self.message,
                "worst": self.worst.to_dict() if self.worst else None,
                "ratio": self.ratio if self.ratio != float("inf") else "inf", "checks": list(self.checks),
                **({"also": list(self.also)} if self.also else {}),  # absent when empty: older files stay as they are
                **({"batch_invariant": self.batch_invariant} if self.batch_invariant is not None else {}),
                **({"known_entry": self.known_entry} if self.known_entry else {})}

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        worst = data.get("worst")
        ratio = data.get("ratio", 0.0)
        return cls(status=data["status"], diagnosis=data.get("diagnosis"), message=data.get("message", ""),
                   worst=Worst(worst["tensor"], tuple(worst["index"]), worst["got"], worst["expected"]) if worst
                   else None, ratio=float(ratio), checks=tuple(data.get("checks", ())),
                   also=tuple(data.get("also", ())), batch_invariant=data.get("batch_invariant"),
                   known_entry=data.get("known_entry"))


def known_bug_check(link: str) -> str:
    """The line a verdict marked KNOWN carries among its checks: which known bug it matched."""
    return f"known bug: {link}"


def as_known(verdict: Verdict, link: str, entry: str | None) -> Verdict:
    """A failure `verdict` as KNOWN: the known bug's link among its checks, and the id of the entry that took it."""
    return replace(verdict, status=KNOWN, checks=verdict.checks + (known_bug_check(link),), known_entry=entry)
