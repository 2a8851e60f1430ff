"""Combinatorial coverage: which t-way combinations of the case features (strategies/features.py) a backend graded.

A t-way combination is t distinct features with one class each. Its denominator is the feasible ones: those for
which a witness case exists (strategies.features.witness_case) that the backend's Space draws (space.draws) and the
backend does not refuse (`unsupported`). Only graded cases count: a refused case (UNSUPPORTED) covers nothing. For
4-way combinations, a witness each would cost seconds: they count as feasible when each of their 3-way parts is (an
upper bound, said so in the report).
"""

from __future__ import annotations

import itertools
import math
import torch

from attnfuzz.backends.base import Backend
from attnfuzz.engine.harness import served_space
from attnfuzz.report.table import Table
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.features import FEATURES, vector, witness_case
from attnfuzz.strategies.space import Space, draws, narrow_to

WAYS = (2, 3, 4)
CHECKPOINTS = (100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


def _witnessed(classes: dict[str, str], space: Space, unsupported, spellings) -> bool:
    case = witness_case(classes)
    if case is None:
        return False
    if "spelling_form" in classes:
        named = [s for s in spellings(case) if bool(s) == (classes["spelling_form"] == "on")]
        if not named:
            return False
        case = case.replace(spelling=named[0])
    try:
        return draws(space, case) and unsupported(case) is None
    except Exception:  # an adapter rule that cannot read the witness: not shown feasible
        return False


class Feasible:
    """Per tuple of feature indices (t <= 3), a bool tensor over the product of their classes: which combinations
    are feasible for one backend and Space."""

    def __init__(self, space: Space, unsupported=lambda c: None, spellings=lambda c: ("",)):
        self.space, self.unsupported, self.spellings = space, unsupported, spellings
        self.tables: dict[tuple[int, ...], torch.Tensor] = {}

    def table(self, axes: tuple[int, ...]) -> torch.Tensor:
        if axes not in self.tables:
            if len(axes) > 3:
                self.tables[axes] = self._from_parts(axes)
            else:
                feats = [FEATURES[i] for i in axes]
                ok = [_witnessed({f.name: v for f, v in zip(feats, values)}, self.space, self.unsupported,
                                 self.spellings) for values in itertools.product(*(f.values for f in feats))]
                self.tables[axes] = torch.tensor(ok, dtype=torch.bool)
        return self.tables[axes]

    def _from_parts(self, axes: tuple[int, ...]) -> torch.Tensor:
        sizes = [len(FEATURES[i].values) for i in axes]
        grid = torch.ones(sizes, dtype=torch.bool)
        for keep in itertools.combinations(range(len(axes)), 3):
            part = self.table(tuple(axes[k] for k in keep)).reshape([sizes[k] for k in keep])
            shape = [sizes[k] if k in keep else 1 for k in range(len(axes))]
            grid &= part.reshape(shape)
        return grid.reshape(-1)


_FEASIBLE: dict[tuple, Feasible] = {}


def feasible_of(backend, space: Space) -> Feasible:
    """The Feasible table of a backend within `space`, narrowed as the harness narrows it to draw its cases
    (attnfuzz.engine.harness.cases_for: paged caches for a backend that serves them, narrow_to its refusals). One
    per backend name, device and Space in a process."""
    key = (backend.name, backend.device, space)
    if key not in _FEASIBLE:
        _FEASIBLE[key] = Feasible(narrow_to(served_space(backend, space), backend.unsupported), backend.unsupported,
                                  backend.spellings)
    return _FEASIBLE[key]


def _codes(vectors: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
    code = torch.zeros(vectors.shape[0], dtype=torch.long)
    for i in axes:
        code = code * len(FEATURES[i].values) + vectors[:, i]
    return code


class Combos:
    """The feature vectors of one backend's graded cases, in the order they were graded."""

    def __init__(self) -> None:
        self.vectors: list[tuple[int, ...]] = []

    def add(self, case: Case) -> None:
        self.vectors.append(vector(case))

    def report(self, feasible: Feasible, ways: tuple[int, ...] = WAYS, times: int = 3) -> dict:
        """Per t: feasible combinations, those graded at least once and at least `times` times, and coverage against
        the number of cases (at CHECKPOINTS and the last case)."""
        n = len(self.vectors)
        vectors = torch.tensor(self.vectors, dtype=torch.long).reshape(n, len(FEATURES))
        marks = [c for c in CHECKPOINTS if c < n] + [n]
        out = {"cases": n}
        for t in ways:
            total = covered = repeated = 0
            firsts = []
            for axes in itertools.combinations(range(len(FEATURES)), t):
                ok = feasible.table(axes)
                total += int(ok.sum())
                if not n:
                    continue
                codes = _codes(vectors, axes)
                counts = torch.bincount(codes, minlength=ok.numel())
                covered += int(((counts > 0) & ok).sum())
                repeated += int(((counts >= times) & ok).sum())
                first = torch.full((ok.numel(),), n, dtype=torch.long).scatter_reduce(
                    0, codes, torch.arange(n), reduce="amin")
                firsts.append(first[ok])
            first_all = torch.sort(torch.cat(firsts)).values if firsts else torch.zeros(0, dtype=torch.long)
            curve = [[m, int(torch.searchsorted(first_all, m))] for m in marks] if n else []
            out[f"{t}-way"] = {"feasible": total, "covered": covered, f"at_least_{times}": repeated,
                               "share": covered / total if total else math.nan,
                               **({"feasible_by": "every 3-way part feasible (an upper bound)"} if t > 3 else {}),
                               "curve": curve}
        return out


def campaign_reports(combos: dict[str, Combos], device: str, max_len: int | None) -> dict[str, dict]:
    """The report of each backend's graded cases, within the Space a campaign on `device` draws from (a backend not
    registered here, a user's own kernel, by the Space's rules alone)."""
    from attnfuzz.backends import get
    space = Space.for_device(device, max_len)
    reports = {}
    for name in sorted(combos):
        try:
            backend = get(name, device)
        except Exception:   # the base adapter's defaults: no refusals, the default spelling, no paged caches
            backend = Backend()
            backend.name, backend.device = name, device
        reports[name] = combos[name].report(feasible_of(backend, space))
        unavailable = backend.available()
        if unavailable is not None:  # its refusals here are "not available": no combination is shown feasible
            reports[name]["unavailable"] = unavailable
    return reports


def combos_table(reports: dict[str, dict]) -> Table:
    rows = []
    for name, report in reports.items():
        if "unavailable" in report:
            rows.append([name, str(report["cases"]), f"not judged here: {report['unavailable']} (feasibility is the "
                         f"backend's own refusals: build the report where it runs)", "-", "-", "-"])
            continue
        share = {k: f"{100 * report[k]['share']:.1f}% of {report[k]['feasible']:,}" for k in ("2-way", "3-way", "4-way")}
        three = report["3-way"]
        rows.append([name, str(report["cases"]), share["2-way"], share["3-way"],
                     f"{100 * three['at_least_3'] / max(three['feasible'], 1):.1f}%", share["4-way"]])
    return Table("Feature combinations graded", ["backend", "graded cases", "2-way", "3-way", "3-way, 3 times",
                                                 "4-way"], rows,
                 "t features with one class each (strategies/features.py) that some graded case had, of those "
                 "feasible for the backend: a case exists with them all that its Space draws and it does not refuse; "
                 "4-way: feasible where each 3-way part is (an upper bound)")


def describe(report: dict) -> str:
    """One line: 'features of 1,234 graded cases: 2-way 97.1% of 1,650, 3-way 71.4% of 24,000 (52.0% 3 times)'."""
    parts = []
    for key, row in report.items():
        if key == "cases":
            continue
        repeated = next((v for k, v in row.items() if k.startswith("at_least_")), None)
        extra = f" ({100 * repeated / row['feasible']:.1f}% 3 times)" if row["feasible"] and key == "3-way" else ""
        parts.append(f"{key} {100 * row['share']:.1f}% of {row['feasible']:,}{extra}")
    return f"feature combinations of {report['cases']:,} graded cases: " + ", ".join(parts)
