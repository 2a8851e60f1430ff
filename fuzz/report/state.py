"""The lanes' progress files (a campaign's state/): what each backend's finished rounds ran, summed over its lanes,
and the report's table of it."""

from __future__ import annotations

from attnfuzz.report.table import Table


def add_state(state: dict[str, dict], stem: str, data: dict) -> None:
    """Sum a progress file into per-backend rounds / cases / examples / seconds / lanes: a lane's file holds
    {"backends": {name: progress}}, a backend's own file (state/<backend>.json) the progress itself. Cases are None
    where a file does not count them (written before lanes did)."""
    per_backend = data["backends"] if "backends" in data else {stem: data}
    for name, progress in per_backend.items():
        into = state.setdefault(name, {"rounds": 0, "cases": 0, "examples": 0, "seconds": 0.0, "lanes": 0})
        for key in ("rounds", "examples", "seconds"):
            into[key] += progress.get(key) or 0
        into["cases"] = None if into["cases"] is None or "cases" not in progress else into["cases"] + progress["cases"]
        into["lanes"] += 1
        for key in ("configurations", "fresh_seconds", "pinned_seconds"):   # a compiling backend's lanes count them
            if key in progress:
                into[key] = into.get(key, 0) + progress[key]


def state_table(state: dict[str, dict]) -> Table:
    rows = [[name, str(s["lanes"]), str(s["rounds"]), "-" if s["cases"] is None else str(s["cases"]),
             str(s["examples"]), f"{s['seconds']:.0f}", str(s.get("configurations", "-")), _fresh_share(s)]
            for name, s in sorted(state.items())]
    return Table("Progress (state/)", ["backend", "lanes", "rounds", "cases", "examples", "seconds",
                                       "configurations met", "fresh draws' time"], rows,
                 "rounds finished, summed over lanes: the cases they ran, as the totals above count them (a round cut "
                 "short by the deadline is not counted here, its cases are in the totals), and the examples Hypothesis "
                 "ran in them, which also count each case drawn again (a repeat, a shrink step, a replay from the "
                 "example database), answered from the log; for a backend with a compile-aware search, the kernel "
                 "configurations its lanes met (a configuration met in two lanes, or again after a lane's restart, "
                 "counts twice) and, where the search balances time (--compile-time-share), the share of its draws' "
                 "time that went to fresh draws, which may compile: the rest went to cases inside configurations met")


def _fresh_share(progress: dict) -> str:
    fresh, pinned = progress.get("fresh_seconds"), progress.get("pinned_seconds")
    return f"{fresh / (fresh + pinned):.0%}" if fresh is not None and pinned is not None and fresh + pinned > 0 else "-"
