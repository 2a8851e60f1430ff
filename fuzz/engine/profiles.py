"""Hypothesis profiles: quick (the default), ci (derandomized, no deadline) and campaign (a large budget).

Registered on import; the CLI and the pytest plugin load one by name. No deadline anywhere: a first call that
compiles a kernel (flex, FA4) takes seconds, and a deadline would report that as flakiness.

quick and ci leave out Hypothesis's target phase: from half the budget on, it hill-climbs the case with the worst
error / bound for as long as that keeps improving, so the second half of a run mutates one case (measured with
bench/distribution.py: 40 % of the cases in one sq bucket instead of 18 %). Their cases then follow the strategy's
own weights. campaign keeps it, and a campaign's lanes turn it off in three rounds of four (campaign/lane.py).

A profile registered here takes what it does not set from Hypothesis's default settings at import, and where
Hypothesis sees a CI environment (CI=true and the like) that default is its own derandomized "ci" profile. campaign
says derandomize=False itself: derandomized, every round of a campaign in CI drew the same cases again (290 distinct
cases in 9,800 examples of a 20-second lane) and, seeded, ran without its example database.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

_NO_TARGET = tuple(p for p in Phase if p != Phase.target)
PROFILES = {
    "quick": dict(max_examples=100, phases=_NO_TARGET),
    "ci": dict(max_examples=300, derandomize=True, database=None, print_blob=True, phases=_NO_TARGET),
    "campaign": dict(max_examples=100_000, phases=tuple(Phase), derandomize=False),
}
# filter_too_much: a backend's refusals are rejected draws (engine/harness.py), and a backend may refuse most of a
# narrow space's first draws; its Tally says what it refused
_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                     HealthCheck.filter_too_much],
               report_multiple_bugs=True)

for _name, _options in PROFILES.items():
    settings.register_profile(f"attnfuzz-{_name}", **{**_COMMON, **_options})


def for_backend(base: settings, cost: float, max_examples: int | None) -> settings:
    """The profile's example budget divided by the backend's cost, unless the user named a number."""
    if max_examples is not None or cost <= 1:
        return base
    return settings(base, max_examples=max(10, int(base.max_examples / cost)))


def profile(name: str, **overrides) -> settings:
    """The settings of a profile by name, with overrides (e.g. max_examples); ValueError names a wrong name."""
    if name not in PROFILES:
        raise ValueError(f"--profile={name!r} is not a profile; choose one of {', '.join(PROFILES)}")
    base = settings.get_profile(f"attnfuzz-{name}")
    return settings(base, **{k: v for k, v in overrides.items() if v is not None})
