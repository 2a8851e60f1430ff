"""Every option that several front ends share, declared once: its name, how its value is parsed, default and help.

The CLI adds an option as `--NAME`; the pytest plugin, which pytest loads into every session of the environment,
adds it as `--attnfuzz-NAME`, so it never claims a generic name (`--device`, `--backend`) that another plugin or a
user's conftest.py declares. A value that cannot be used fails while the command line is parsed and the message
names the option and the fix: the CLI exits 2, pytest reports a usage error.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from attnfuzz.engine.poison import HELP as POISON_HELP
from attnfuzz.engine.profiles import PROFILES

PLUGIN_PREFIX = "attnfuzz-"


def _at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give {least} or more") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; give {least} or more")
    return value


def count(text: str) -> int:
    """A whole number of 1 or more (examples, threads, lengths, runs)."""
    return _at_least(text, 1)


def whole(text: str) -> int:
    """A whole number of 0 or more (0: never)."""
    return _at_least(text, 0)


def positive(text: str) -> float:
    """A finite number above 0 (seconds, hours)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give one above 0") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not allowed; give a number above 0")
    return value


def fraction(text: str) -> float:
    """A share from 0 up to but not including 1 (0: off)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a share from 0 up to 1, such as 0.5") \
            from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not allowed; give a share from 0 up to 1 (0: off), such as 0.5")
    return value


def device(text: str) -> str:
    """cpu, cuda or cuda:N; whether the device exists here is checked when a command uses it."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; use cpu, cuda or cuda:N")
    return text


def profile_name(text: str) -> str:
    if text not in PROFILES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a profile; choose one of {', '.join(PROFILES)}")
    return text


@dataclass(frozen=True)
class Option:
    name: str                     # as typed after the dashes, e.g. "max-examples"
    help: str
    type: Callable[[str], Any] | None = None
    default: Any = None
    action: str | None = None     # "store_true" or "append"
    metavar: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    def kwargs(self, **overrides) -> dict:
        out = {"help": self.help, "default": self.default, **self.extra}
        if self.action:
            out["action"] = self.action
        if self.type:
            out["type"] = self.type
        if self.metavar:
            out["metavar"] = self.metavar
        out.update(overrides)
        if out.get("action") == "append" and out["default"] is None:
            out["default"] = []
        return out


_ISOLATE = ("run each backend in a worker process: a segfault, abort or fatal CUDA error costs one case (CRASH), a "
            "hang 3 x --case-timeout seconds (HANG; after the first, 3 x max(2 s, 10 x the slowest case seen)), not the run "
            "(a fuzz run on a GPU does so by default)")
_CASE_TIMEOUT = ("seconds one isolated case may take (default {default:g}); one that takes longer is run again in a "
                 "fresh worker with twice the limit, and is a HANG only if that times out too (a HANG costs 3 x "
                 "this); a slow case that finishes keeps its verdict")

OPTIONS = {o.name: o for o in (
    Option("backend", "backend to fuzz: a registry name or package.module:function (repeatable)", action="append"),
    Option("device", "cpu, cuda or cuda:N (default cpu)", type=device, default="cpu"),
    Option("profile", f"Hypothesis profile: one of {', '.join(PROFILES)} (default quick: 100 examples; ci: 300, "
           "derandomized; campaign: 100,000)", type=profile_name, default="quick", metavar="NAME"),
    Option("max-examples", "examples per backend (default: the profile's)", type=count, metavar="N"),
    Option("seed", "Hypothesis seed, for a reproducible run", type=int, metavar="N"),
    Option("max-len", "longest sequence drawn, decode keys included (default 2048 on a CPU; on a GPU 16384, and "
           "131072 keys for decode shapes); one case in 10 is longer than 160", type=count, metavar="N"),
    Option("threads", "torch CPU threads (default 1: small cases are latency-bound, and intra-op threads cost 8x "
           "under load)", type=count, default=1, metavar="N"),
    Option("first-bug", "stop the search at the first failure and shrink that one alone (Hypothesis's "
           "report_multiple_bugs=False: the shrink may move to a smaller case of another label); the other failures "
           "it met are saved as found, unshrunk. The first shrunk finding is saved sooner where a backend shows "
           "several bugs", action="store_true"),
    Option("isolate", _ISOLATE, action="store_true"),
    Option("no-isolate", "fuzz a GPU backend in this process (faster to start; a kernel's fault then ends the run, "
           "as it leaves the process's CUDA context broken for every case after it)", action="store_true"),
    Option("case-timeout", _CASE_TIMEOUT, type=positive, default=300.0, metavar="SECONDS"),
    Option("poison-memory", POISON_HELP, action="store_true"),
    Option("skip-unavailable", "skip a backend named that cannot run here, saying why, instead of stopping with exit "
           "2 (a run that can run none of its backends still stops)", action="store_true"),
    Option("replay-workers", "corpus entries replayed at once, each in an isolated worker of its own (default 1; "
           "more than 1 implies --isolate)", type=count, default=1, metavar="N"),
    Option("replay-hang-timeout", "seconds a corpus entry saved as a HANG gets when replayed isolated (default "
           "{default:g}; confirming the hang in a fresh worker at twice that, it replays in 3 x this)", type=positive,
           default=20.0, metavar="SECONDS"),
    Option("budget", "seconds the cross-check of a bug report may take in all (default {default:g}); a backend it "
           "cuts off or does not reach is listed as not run: over the time budget. The entry's own backend runs its "
           "spelling whatever it takes", type=positive, default=30.0, metavar="SECONDS"),
    Option("backend-limit", "seconds one backend may take in a bug report's cross-check, its spellings together "
           "(default {default:g}); a library's import, which serves every backend of its family, counts against "
           "--budget only", type=positive, default=10.0, metavar="SECONDS"),
    Option("compile-time-share", "for a backend that compiles kernels (FA4, FlashInfer, compiled flex, TE, cuDNN's "
           "graphs): the share of the time its fresh draws, which may compile, get; the rest goes to cases inside "
           "the kernel configurations it compiled already (default: a fixed share of fresh draws, which keeps a "
           "seeded or derandomized run's cases the same on every machine)", type=fraction, metavar="S"),
    Option("corpus", "folder where findings are saved (default: $ATTNFUZZ_CORPUS, else "
           "~/.local/share/attnfuzz/corpus); known bugs are read from it and from the corpus shipped with attnfuzz",
           type=Path, metavar="DIR"),
)}


def isolating(device: str, isolate: bool, no_isolate: bool = False) -> bool:
    """Whether a fuzz run isolates its backends: when asked (--isolate), and by default on a GPU, where a kernel's
    fault leaves the process's CUDA context broken for every case after it; --no-isolate keeps such a run here."""
    return isolate or (str(device).startswith("cuda") and not no_isolate)


def time_share_conflict(share: float | None, seed: int | None, derandomized: bool, profile_name: str) -> str | None:
    """Why a run may not take --compile-time-share, or None: the time share follows the machine's timing, so a run
    that promises the same cases again (a seed, a derandomized profile) must keep the fixed share."""
    if not share or (seed is None and not derandomized):
        return None
    given = "--seed" if seed is not None else f"a derandomized profile ({profile_name})"
    return (f"--compile-time-share {share:g} with {given}: the time share follows this machine's timing, so the run "
            "would not draw its cases again; drop --compile-time-share, or run without --seed and with --profile "
            "quick or campaign (quick is derandomized where Hypothesis sees CI=true; campaign never is)")


def add(parser, *names: str, **overrides) -> None:
    """Add the named options to an argparse parser as --NAME; `overrides` maps an option's dest to keyword changes,
    e.g. case_timeout={"default": 120.0}, and "shown_default" to the default the help names when `default` is None
    because the command resolves it later."""
    for name in names:
        option = OPTIONS[name]
        changes = dict(overrides.get(option.dest, {}))
        shown = changes.pop("shown_default", None)
        kwargs = option.kwargs(**changes)
        kwargs["help"] = kwargs["help"].format(default=shown if shown is not None else kwargs["default"])
        parser.add_argument(f"--{name}", dest=option.dest, **kwargs)


def add_to_pytest(group, *names: str) -> None:
    """Add the named options to a pytest option group as --attnfuzz-NAME, read back as attnfuzz_<dest>."""
    for name in names:
        option = OPTIONS[name]
        kwargs = option.kwargs()
        kwargs["help"] = kwargs["help"].format(default=kwargs["default"])
        group.addoption(f"--{PLUGIN_PREFIX}{name}", dest=f"attnfuzz_{option.dest}", **kwargs)
