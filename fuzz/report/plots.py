"""The campaign report's PNG plots (matplotlib, Agg): error ratios, outcomes, and coverage marginals per backend.

Each function draws one figure from plain counts and writes it to `path`; with nothing to draw it still writes a
figure that says so, so the report never links a missing file. matplotlib is imported inside the functions, so
reading a campaign does not need it.
"""

from __future__ import annotations

import math
from pathlib import Path

from attnfuzz.report.coverage import AXES, Coverage

RATIO_FLOOR, RATIO_CEIL = 1e-6, 1e6   # ratio 0 (exact) and inf are drawn at these edges of the log axis
# outcome -> colour in the outcome bars
COLOURS = {"passed": "#4daf4a", "failed": "#e41a1c", "known": "#ff9f1a", "crashed": "#984ea3", "refused": "#b0b0b0"}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="#555555")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_ratios(ratios: dict[str, list[float]], path: Path) -> Path:
    """ECDF of error / bound per backend over its graded cases, log x, the bound 1.0 marked. A backend with no graded
    case is named in the legend without a line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if not any(ratios.values()):
        _empty(ax, "no graded cases: every case was refused or crashed")
        ax.set_title("error / bound (ECDF per backend)")
        return _save(fig, path)
    for name in sorted(ratios):
        values = sorted(min(max(r, RATIO_FLOOR), RATIO_CEIL) for r in ratios[name] if not math.isnan(r))
        if not values:
            ax.plot([], [], " ", label=f"{name}: no graded cases")
            continue
        over = sum(v > 1 for v in values)
        n = len(values)
        ax.step(values, [(i + 1) / n for i in range(n)], where="post", label=f"{name} ({n} graded, {over} > 1)")
    ax.axvline(1.0, color="#e41a1c", linestyle="--", linewidth=1.2, label="bound (ratio 1)")
    ax.set_xscale("log")
    ax.set_xlim(RATIO_FLOOR / 2, RATIO_CEIL * 2)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"max error / bound (0 drawn at {RATIO_FLOOR:g}, inf at {RATIO_CEIL:g})")
    ax.set_ylabel("share of graded cases <= x")
    ax.set_title("error / bound (ECDF per backend)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path)


def plot_outcomes(outcomes: dict[str, dict[str, int]], path: Path) -> Path:
    """One horizontal bar per backend split by outcome share (keys of COLOURS), each bar labelled with its total."""
    plt = _pyplot()
    names = sorted(outcomes)
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.45 * max(len(names), 1)))
    if not names:
        _empty(ax, "no cases")
        return _save(fig, path)
    for row, name in enumerate(names):
        total = max(sum(outcomes[name].values()), 1)
        left = 0.0
        for kind, colour in COLOURS.items():
            share = outcomes[name].get(kind, 0) / total
            ax.barh(row, share, left=left, color=colour, label=kind if row == 0 else None)
            left += share
        ax.text(1.01, row, f"{sum(outcomes[name].values())} cases", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of cases")
    ax.set_title("outcomes per backend")
    ax.legend(ncol=len(COLOURS), fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.08), frameon=False)
    return _save(fig, path)


def _compact(n: int) -> str:
    return str(n) if n < 1000 else (f"{n / 1000:.1f}k" if n < 100_000 else f"{n // 1000}k")


def plot_coverage(coverage: Coverage, path: Path) -> Path:
    """Per axis, a backend x value grid. Colour: the share of the cases that ran (were not refused) that passed, red
    0 to green 1; grey where every case was refused, white where none was drawn. Text: the case count, then the
    failed (F), known (K) and refused (R) counts that are not 0."""
    plt = _pyplot()
    names = coverage.backends()
    if not names:
        fig, ax = plt.subplots(figsize=(8, 2))
        _empty(ax, "no cases")
        return _save(fig, path)
    cmap = plt.get_cmap("RdYlGn")
    margins = {name: coverage.marginals(name) for name in names}
    heights = [0.9 + 0.4 * len(names)] * len(AXES)
    fig, axes = plt.subplots(len(AXES), 1, figsize=(11, sum(heights) + 0.8), layout="constrained",
                             gridspec_kw={"height_ratios": heights})
    for ax, axis in zip(axes, AXES):
        grid = [[_colour(m.counts, cmap) for m in margins[name][axis.name]] for name in names]
        ax.imshow(grid, aspect="auto", interpolation="nearest")
        for r, name in enumerate(names):
            for c, m in enumerate(margins[name][axis.name]):
                if m.counts.cases:
                    red, green, blue = grid[r][c][:3]
                    dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.45
                    ax.text(c, r, _cell_text(m.counts), ha="center", va="center", fontsize=7, linespacing=0.9,
                            color="white" if dark else "black")
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_xticks(range(len(axis.values)), axis.values, fontsize=8, rotation=20, ha="right")
        ax.set_title(axis.name, fontsize=9, loc="left")
    scale = fig.colorbar(plt.cm.ScalarMappable(cmap=cmap), ax=list(axes), location="top", shrink=0.5, aspect=40)
    scale.set_label("share passed of the cases that ran (grey: all refused, white: none drawn)", fontsize=8)
    scale.ax.tick_params(labelsize=7)
    return _save(fig, path)


def _cell_text(counts) -> str:
    extra = " ".join(f"{n}{tag}" for n, tag in ((counts.failed, "F"), (counts.known, "K"), (counts.refused, "R"))
                     if n)
    return _compact(counts.cases) + (f"\n{extra}" if extra else "")


def _colour(counts, cmap) -> tuple[float, ...]:
    ran = counts.cases - counts.refused
    if counts.cases == 0:
        return (1.0, 1.0, 1.0, 1.0)
    if ran == 0:
        return (0.75, 0.75, 0.75, 1.0)
    return tuple(cmap(counts.passed / ran))


def plot_combinations(reports: dict[str, dict], path: Path) -> Path:
    """Per backend, the share of its feasible 2-, 3- and 4-way feature combinations graded, against the number of
    graded cases (fuzz/report/combos.py), on a log scale of cases."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
    drawn = False
    for name, report in sorted(reports.items()):
        for way, style in (("2-way", ":"), ("3-way", "-"), ("4-way", "--")):
            row = report.get(way) or {}
            curve = row.get("curve") or []
            if curve and row.get("feasible"):
                ax.plot([n for n, _ in curve], [100 * k / row["feasible"] for _, k in curve], style, marker=".",
                        label=f"{name} {way}")
                drawn = True
    if not drawn:
        _empty(ax, "no graded cases")
        return _save(fig, path)
    ax.set_xscale("log")
    ax.set_xlabel("graded cases")
    ax.set_ylabel("% of feasible combinations graded")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def plot_rate(timelines: dict, start: float | None, path: Path) -> Path:
    """Graded cases per minute against the campaign's minutes, one line per backend (report/rate.py's Timeline),
    refused cases per minute dotted in the same colour where there were any."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.set_title("graded cases per minute")
    if start is None or not any(line.cases for line in timelines.values()):
        _empty(ax, "no case carries a time")
        return _save(fig, path)
    for name in sorted(timelines):
        minutes = timelines[name].per_minute(start)
        if not minutes:
            continue
        (graded,) = ax.plot([m for m, _, _ in minutes], [g for _, g, _ in minutes], marker=".", label=name)
        if any(r for _, _, r in minutes):
            ax.plot([m for m, _, _ in minutes], [r for _, _, r in minutes], linestyle=":", color=graded.get_color(),
                    label=f"{name}: refused")
    ax.set_xlabel("minutes since the first case")
    ax.set_ylabel("cases")
    ax.legend(fontsize=8)
    return _save(fig, path)
