"""One lane of a campaign: a process that fuzzes the campaign's backends in rounds on one device, until time is up.

Everything a lane does is on disk as it happens, so a lane (or the whole campaign) killed at any moment resumes
without losing a finding or repeating finished work:

    cases/lane<i>.jsonl     every case run, with its verdict (appended and flushed per case)
    state/lane<i>.json      per backend: rounds finished, the cases they ran (logged) and the examples Hypothesis ran
                            (a case drawn again is an example answered from the log, not a case run), seconds
    .inflight-lane<i>.json  the case running now (write-ahead); on resume it runs first
    corpus/                 findings, saved when a round ends (shrunk) or when time runs out (as found)
    db/ or Redis            Hypothesis's example database: failures replay in later rounds, resumes, other lanes

On resume the log is loaded as a cache: a case already run is answered from it, not run again. Rounds are not
seeded: Hypothesis ignores the example database in a seeded run, and the database is how failures are shared.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from hypothesis import Phase

from attnfuzz.campaign.database import KeepFailures, open_database
from attnfuzz.store import caselog
from attnfuzz.engine import interrupt, memshare, poison
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import inflight as inflight_io
from attnfuzz.store.known import mark_known
from attnfuzz.backends import get
from attnfuzz.engine.compiled_search import compiled_configs, declares_compile_key
from attnfuzz.engine.harness import CONFIRM_RERUNS, Finding, Tally, confirm, fuzz, run_case
from attnfuzz.engine.rootcause import Evidence, merge_root_causes, twin_name
from attnfuzz.engine.isolate import isolated
from attnfuzz.engine.skip_known import skipping
from attnfuzz.engine.profiles import for_backend, profile
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space


CLIMB_EVERY = 4   # Hypothesis's target phase in one round in 4 per backend (campaign.json "climb_every"; 0 never)
COMPILE_TIME_SHARE = 0.5   # of a compiling backend's time, for its fresh draws (campaign.json; 0: the fixed share)
COMPILE_TALLY = ("configurations", "fresh_seconds", "pinned_seconds")   # a compiling backend's state (_compile_tally)


def round_phases(r: int, climb_every: int) -> tuple[Phase, ...]:
    """The phases of round `r` (from 0): every phase in the last round of each `climb_every`, no target phase in the
    others. The target phase hill-climbs the case with the worst error / bound from half a round's examples on, and
    keeps a Pareto front in the example database that the next round climbs from again. Climbing every round, a
    90-second CPU campaign drew a third fewer distinct shapes than climbing one round in four (docs/performance.md)."""
    if climb_every and r % climb_every == climb_every - 1:
        return tuple(Phase)
    return tuple(p for p in Phase if p != Phase.target)


END_RERUN_S = 60.0     # when time is up, how long a lane may rerun the failures it saves unshrunk, to confirm them


class TimeUp(BaseException):
    """Raised inside a round when the campaign's time is spent: Hypothesis lets a BaseException through unshrunk."""


def case_key(backend: str, case: Case) -> str:
    return backend + " " + json.dumps(case.to_dict(), sort_keys=True)


class Resumable:
    """Runs a backend's cases through `run` (a Worker or in-process), with write-ahead, a per-case log line and a
    cache of every case already logged; raises TimeUp once `deadline` (perf_counter) has passed. A failure that
    `known` recognises is logged and returned as KNOWN, so the search goes on past it."""

    def __init__(self, backend: str, run, log, inflight: Path, done: dict, deadline: float, lane: int):
        self.backend, self._run, self.log, self.inflight = backend, run, log, inflight
        self.done, self.deadline, self.lane = done, deadline, lane
        self.known = None
        self.ran = 0  # cases run and logged (not answered from the log)

    def rerun(self, case: Case) -> V.Verdict:
        """Run again, past the cache: the harness's confirming reruns of a finding."""
        return self._run(case)

    def run(self, case: Case) -> V.Verdict:
        if time.perf_counter() > self.deadline:  # cached cases too: Hypothesis can spin on them (target phase)
            raise TimeUp()
        key = case_key(self.backend, case)
        if key in self.done:
            return self._mark(case, self.done[key])
        interrupt.check()
        try:  # an interruption unwinds through here: its case is not the lane's crash (attnfuzz.engine.interrupt)
            self.inflight.write_text(json.dumps({"backend": self.backend, "case": case.to_dict()}))
            start = time.perf_counter()
            verdict = self._mark(case, self._run(case))
            interrupt.check()  # stopped during the case: its verdict is not logged
            self.done[key] = verdict
            self.log.write(caselog.record(self.backend, case, verdict, time.perf_counter() - start, lane=self.lane,
                                          time=round(time.time(), 3), verdict=verdict.to_dict()))
            self.log.flush()
            self.ran += 1
        finally:
            self.inflight.unlink(missing_ok=True)
        return verdict

    def _mark(self, case: Case, verdict: V.Verdict) -> V.Verdict:
        """KNOWN when `known` recognises the failure now (a cached one too: the corpus grows as the campaign runs)."""
        return mark_known(self.known, self.backend, case, verdict)


def load_log(path: Path) -> dict:
    """case key -> Verdict for every complete line of a lane's log (a line cut by a kill is ignored)."""
    done = {}
    for row in caselog.rows(path) if path.exists() else ():
        try:
            done[case_key(row["backend"], Case.from_dict(row["case"]))] = V.Verdict.from_dict(row["verdict"])
        except (KeyError, ValueError):
            continue
    return done


def seen_in(directory: Path):
    """A `known` predicate: failures whose backend and label already have an entry in `directory`, so a campaign
    searches past a bug it has saved instead of shrinking it again every round; and failures whose output an entry's
    diagnosis explains as well (its label among the verdict's `also`: a dropped mask that reads as WINDOW_OFF_BY_ONE
    on a small case, once MASK_IGNORED is saved), which are that entry's root cause again."""
    seen = saved_labels(directory)

    def known(backend: str, case: Case, verdict: V.Verdict) -> dict | None:
        if explained(seen, backend, verdict):
            return {"link": caselog.SEEN_HERE, "note": f"already found in this campaign ({directory})"}
        return None

    return known


def saved_labels(directory: Path) -> set[tuple[str, str]]:
    """(backend, label) of every entry in `directory`, and of every label attached to one as the same root cause."""
    entries = corpus_io.load_all(directory)[0] if directory.exists() else []
    return {(e.backend, v.label) for _, e in entries for v in (e.verdict, *(v for _, v in e.attached))}


def explained(seen: set[tuple[str, str]], backend: str, verdict: V.Verdict) -> bool:
    """Whether a (backend, label) in `seen` is this failure's label, or a diagnosis its output matched too."""
    return (backend, verdict.label) in seen or any((backend, f"{verdict.status}:{d}") in seen for d in verdict.also)


def either(*predicates):
    def known(backend, case, verdict):
        return next((hit for p in predicates if (hit := p(backend, case, verdict)) is not None), None)
    return known


def lane_backends(backends: list[str], lanes: int, index: int) -> list[str]:
    """The backends lane `index` fuzzes: dealt round-robin when there are at least as many as lanes (each loaded on
    one device only), else one each, so no lane idles."""
    return backends[index::lanes] if len(backends) >= lanes else [backends[index % len(backends)]]


def _compile_tally(backend) -> tuple:
    """What this process's compile-aware search of `backend` has met so far: its compile keys, and the seconds its
    fresh and its pinned draws took (None where the backend declares no key, or the search keeps a fixed share)."""
    if not declares_compile_key(backend):
        return None, None, None
    configs = compiled_configs(backend)
    balance = configs.balance
    return (len(configs), None if balance is None else balance.fresh_seconds,
            None if balance is None else balance.pinned_seconds)


class Lane:
    def __init__(self, campaign: Path, index: int):
        self.dir, self.index = campaign, index
        self.config = json.loads((campaign / "campaign.json").read_text())
        self.device = self.config["device"]
        self.state_path = campaign / "state" / f"lane{index}.json"
        self.state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {
            "elapsed": 0.0, "backends": {}}
        self.log_path = campaign / "cases" / f"lane{index}.jsonl"
        self.inflight = campaign / f".inflight-lane{index}.json"
        self.corpus = campaign / "corpus"
        self.known_dir = corpus_io.findings_dir(self.config.get("known"))  # known bugs beside the shipped ones
        self.last_record = interrupt.Record(None, "")  # the crash record the last lane left, read in run()
        self.twins: dict[str, str | None] = {}  # saved entry's file name -> the mask error its probe twin names
        self.started = time.perf_counter()
        self.deadline = self.started + self.config["hours"] * 3600 - self.state["elapsed"]

    def space(self) -> Space:
        """The device's default space, within the campaign's --max-len and the lane's share of its GPU, its compiling
        backends' fresh draws held to the campaign's share of the time (strategies/compiled.py's TimeBalance)."""
        share = self.config.get("compile_time_share", COMPILE_TIME_SHARE) or None   # 0: the fixed share
        return Space.for_device(self.device, self.config.get("max_len")).replace(max_bytes=memshare.share_bytes(),
                                                                                 compile_time_share=share)

    def save_state(self) -> None:
        self.state["elapsed"] += time.perf_counter() - self.started
        self.started = time.perf_counter()
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.state_path)  # atomic: a kill never leaves half a state file

    def save_finding(self, backend, case: Case, verdict: V.Verdict, attached=(),
                     unconfirmed: str | None = None) -> Path:
        entry = corpus_io.Entry(backend=backend.name, case=case, verdict=verdict, device=self.device,
                                backend_version=backend.version(), attached=list(attached), unconfirmed=unconfirmed)
        return corpus_io.save(self.corpus, entry)

    def run(self) -> int:
        for sub in ("state", "cases", "corpus"):
            (self.dir / sub).mkdir(exist_ok=True)
        cfg = self.config
        database = open_database(cfg["db"], self.dir)
        done = load_log(self.log_path)
        space = self.space()
        memshare.apply(self.device)   # the cases this lane runs itself (--no-isolate) keep to its share too
        backends = [get(name, self.device) for name in lane_backends(cfg["backends"], cfg["lanes"], self.index)]
        if cfg.get("poison_memory"):
            poison.enable()  # before the workers start: each is handed it
        # each worker imports its backend while the others, and this lane, do the same (isolated starts them at once)
        workers = {b.name: isolated(b, self.device, cfg["case_timeout"], enabled=cfg["isolate"]) for b in backends}
        self.last_record = interrupt.read_record(interrupt.record_path(self.inflight))  # before a new one replaces it
        with self.log_path.open("a") as log, interrupt.crash_record(interrupt.record_path(self.inflight)):
            runners = {}
            crashes = corpus_io.known_bugs(corpus_io.shipped_dir(), self.known_dir)   # the known bugs at the start
            for b in backends:
                # a precise known crash's cases, mostly unrun
                worker = skipping(workers[b.name], b.name, crashes, b.build_errors)
                inner = worker.run if worker else (lambda c, b=b: run_case(b, c, device=self.device))
                runners[b.name] = Resumable(b.name, inner, log, self.inflight, done, self.deadline, self.index)
            reruns = None   # set when the campaign's time is up: the log's failures are then rerun before saving
            try:
                self._recover_inflight(backends, runners)
                rounds = 1 if cfg.get("replay_only") else None
                while rounds is None or min(self._rounds(b) for b in backends) < rounds:
                    r = min(self._rounds(b) for b in backends)
                    for b in backends:
                        if self._rounds(b) == r:
                            self._round(b, r, runners[b.name], database, space)
            except TimeUp:
                reruns = {name: runner.rerun for name, runner in runners.items()}
            finally:
                try:
                    self._save_unsaved(backends, done, reruns)   # with the workers still open for the reruns
                finally:
                    for w in workers.values():
                        if w is not None:
                            w.close()
                    self.save_state()
        return 0

    def _rounds(self, backend) -> int:
        return self.state["backends"].get(backend.name, {}).get("rounds", 0)

    def _round(self, backend, r: int, runner: Resumable, database, space: Space) -> None:
        """One round: up to round_examples cases (and the shrinking of what fails) or round_seconds, whichever comes
        first, so one slow or hanging backend cannot starve the others."""
        cfg = self.config
        runner.deadline = min(self.deadline, time.perf_counter() + cfg["round_seconds"])
        if isinstance(database, KeepFailures):
            database.deadline = runner.deadline
        settings = for_backend(profile("campaign", max_examples=cfg["round_examples"], database=database,
                                       print_blob=False), backend.cost, None)
        phases = round_phases(r, cfg.get("climb_every", CLIMB_EVERY))
        if cfg.get("replay_only"):
            phases = (Phase.reuse, Phase.shrink)
        settings = type(settings)(settings, phases=phases)
        if isinstance(database, KeepFailures):
            database.climbing = Phase.target in phases
        runner.known = either(corpus_io.known_bugs(corpus_io.shipped_dir(), self.known_dir), seen_in(self.corpus))
        ran_before, compiles_before = runner.ran, _compile_tally(backend)
        try:
            tally, findings = fuzz(backend, device=self.device, space=space, settings=settings, worker=runner,
                                   database_key=backend.name)  # no seed: Hypothesis ignores the database if seeded
        except TimeUp:
            if time.perf_counter() > self.deadline:
                raise
            tally, findings = Tally(examples=0), []  # the round's time is up; what it found is in the log
            self._save_unsaved([backend], runner.done, {backend.name: runner.rerun})
        for f in self._join_saved(backend, findings, runner.rerun):
            path = self.save_finding(backend, f.case, f.verdict, f.attached)
            print(f"[lane {self.index}] {backend.name}: {f.verdict.label} saved as {path}", file=sys.stderr)
        entry = self.state["backends"].setdefault(backend.name, {"rounds": 0, "cases": 0, "examples": 0,
                                                                 "seconds": 0.0})
        if "cases" in entry:  # a state saved before lanes counted cases run has none: left unknown
            entry["cases"] += runner.ran - ran_before
        entry["rounds"] = r + 1
        entry["examples"] += tally.examples
        entry["seconds"] = round(entry["seconds"] + tally.seconds, 3)
        for key, now, before in zip(COMPILE_TALLY, _compile_tally(backend), compiles_before):
            if now is not None:
                entry[key] = round(entry.get(key, 0) + now - (before or 0), 3)
        self.save_state()

    def _join_saved(self, backend, findings: list, probe) -> list:
        """The findings left after attaching to an entry this campaign saved for the backend (an earlier round's,
        another lane's) each whose probe twin fails with that entry's mask error (engine/rootcause.py twin_name):
        one root cause, one entry, across rounds as within one."""
        entries = {}
        for path, e in corpus_io.load_all(self.corpus)[0]:
            if e.backend != backend.name:
                continue
            if path.name not in self.twins:
                self.twins[path.name] = twin_name(e.case, e.verdict, probe)
            if self.twins[path.name] is not None:
                entries.setdefault(self.twins[path.name], path)
        kept = []
        for f in findings:
            path = entries.get(twin_name(f.case, f.verdict, probe)) if entries else None
            if path is None:
                kept.append(f)
                continue
            corpus_io.attach(path, [(f.case, f.verdict), *f.attached])
            print(f"[lane {self.index}] {backend.name}: {f.verdict.label} attached to {path.name}, the same root cause "
                  f"(their cases with probe values count the same wrong keys)", file=sys.stderr)
        return kept

    def _recover_inflight(self, backends, runners: dict[str, Resumable]) -> None:
        """The case that was running when the lane ended runs first. With isolation it is simply re-run (the worker
        takes any crash; the file stays until it is logged). Without, it is saved as a CRASH:PROCESS_DIED when the
        crash record says a fatal signal killed the lane; else the lane was stopped from outside (the campaign's
        SIGKILL when it died, the OOM killer) and the case is kept under corpus/.stopped/, not as a finding."""
        inflight = self.inflight
        if not inflight.exists():
            return
        data = json.loads(inflight.read_text())
        backend = next((b for b in backends if b.name == data["backend"]), None)
        case = Case.from_dict(data["case"])
        verdict = None
        if backend is not None and self.config["isolate"]:
            runner = runners[backend.name]
            runner.known = corpus_io.known_bugs(corpus_io.shipped_dir(), self.known_dir)
            verdict = runner.run(case)  # re-runs it, and removes the write-ahead file; the old record goes below
        elif backend is not None:  # judged as `attnfuzz run` judges what it finds on disk
            r = inflight_io.recover_case(inflight, self.last_record, self.corpus, backend, self.device)
            print(f"[lane {self.index}] {backend.name}: {r.message}", file=sys.stderr)
        if verdict is not None and verdict.failed:
            self.save_finding(backend, case, verdict)
        inflight.unlink(missing_ok=True)

    def _save_unsaved(self, backends, done: dict, reruns: dict | None = None) -> None:
        """Failures in the log whose backend and label have no corpus entry yet, nor one whose diagnosis explains
        them (time ran out mid-shrink): the smallest one per label is saved as found, merged by root cause as a
        round's findings are, so nothing the campaign saw is lost. With `reruns` (backend name -> a run past the
        log), each is first rerun as a run confirms its findings, for up to END_RERUN_S in all: saved confirmed or
        FLAKY, though unshrunk; without (or past that time, or interrupted), saved unconfirmed."""
        saved = saved_labels(self.corpus)
        by_name = {b.name: b for b in backends}
        smallest, evidence = {}, {name: Evidence() for name in by_name}
        for key, verdict in done.items():
            name, _, case_json = key.partition(" ")
            if name in evidence:
                evidence[name].add(verdict)
            if not verdict.failed or explained(saved, name, verdict) or name not in by_name:
                continue
            case = Case.from_dict(json.loads(case_json))
            size = case.b * (case.sq + case.skv) * case.h
            if (name, verdict.label) not in smallest or size < smallest[name, verdict.label][0]:
                smallest[name, verdict.label] = (size, case, verdict)
        stop, interrupted = time.perf_counter() + END_RERUN_S, None
        for name in by_name:
            rerun, found, confirmed = (reruns or {}).get(name), [], set()
            for f in [Finding(name, case, verdict) for (n, _), (_, case, verdict) in smallest.items() if n == name]:
                if rerun is not None and interrupted is None and time.perf_counter() < stop:
                    try:   # as the harness does, before merging by root cause
                        f = confirm(f, rerun, CONFIRM_RERUNS)
                        confirmed.add(id(f))
                    except interrupt.Interrupted as e:   # stopped: this one and the rest are saved unconfirmed
                        interrupted = e
                found.append(f)
            for f in merge_root_causes(found, evidence[name]):
                why = None if id(f) in confirmed else corpus_io.OUT_OF_TIME_UNCONFIRMED
                path = self.save_finding(by_name[name], f.case, f.verdict, f.attached, why)
                if why is None:
                    print(f"[lane {self.index}] {name}: {f.verdict.label} saved unshrunk (time ran out) as {path}; "
                          f"`attnfuzz shrink {path} --isolate` shrinks it", file=sys.stderr)
        if interrupted is not None:
            raise interrupted


def main(argv: list[str] | None = None) -> int:
    """python -m attnfuzz.campaign.lane CAMPAIGN_DIR INDEX (started by `attnfuzz campaign`)."""
    argv = sys.argv[1:] if argv is None else argv
    import torch
    torch.set_num_threads(1)
    try:
        with interrupt.interruptible():  # the campaign passes its SIGINT / SIGTERM on; Ctrl-C reaches lanes too
            return Lane(Path(argv[0]), int(argv[1])).run()
    except interrupt.Interrupted as e:
        print(f"[lane {argv[1]}] {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
