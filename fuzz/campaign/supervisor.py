"""`attnfuzz campaign`: long runs that lose nothing. One lane process per GPU (or per CPU worker) fuzzes every backend
of the campaign in rounds (fuzz/campaign/lane.py); this process starts the lanes, restarts one that dies, shows live progress,
and writes the report when time is up.

The campaign directory holds all of it (campaign.json, cases/, state/, corpus/, db/, report/). Running the same
command again on a directory that holds a campaign resumes it: finished cases are not run again, and the time budget
counts what was already spent (`--hours` may raise it). Failures are shared through Hypothesis's example database: a
directory by default, or Redis (`--db redis://host:6379/0`), so several machines can run one campaign.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from attnfuzz.campaign import lanes as lanes_mod
from attnfuzz.campaign.lane import CLIMB_EVERY, COMPILE_TIME_SHARE
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import paths
from attnfuzz.store.parallel_replay import shared_cache_env
from attnfuzz.engine import memshare, options
from attnfuzz.report.coverage import Coverage
from attnfuzz.report.build import build_report

RESTARTS = 3  # a dead lane restarts (resuming from its log) at most this many times in a row without logging a case
LANE_STOP_S = 60  # how long an interrupted campaign waits for a lane to stop before it kills it
WARM_S = 600      # the most the JIT backends' warm-ups (attnfuzz.engine.warm), run at once, take before the lanes start
WARM_MIN_S = 60   # ... and at least this, whatever a short campaign's tenth


class CampaignError(ValueError):
    """Bad campaign options or directory; the message names the option and the fix."""


def add_parser(sub) -> None:
    p = sub.add_parser("campaign", help="a long, resumable, multi-GPU fuzzing campaign with a report at the end")
    p.add_argument("--dir", type=Path, default=Path("campaign"), help="campaign directory; an existing one resumes")
    p.add_argument("--backends", help="comma-separated backend names or package.module:function specs")
    p.add_argument("--hours", type=options.positive, help="time budget in hours, over all resumes (default 1); each "
                   "lane counts it from its own start, after the JIT backends' warm-ups (up to a tenth of it, "
                   "within 60-600 s)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default cpu")
    p.add_argument("--gpus", help="cuda: 'all' (default) or N: one lane per GPU")
    p.add_argument("--workers", type=options.count, help="cpu: lanes to run (default 1); cuda: lanes per GPU (default: "
                   "as many as the host's cores and the GPU's and host's memory allow, fuzz/campaign/lanes.py)")
    p.add_argument("--db", help="example database: a directory (default db, inside --dir) or a redis:// URL")
    p.add_argument("--round-examples", type=options.count, help="examples per backend per round (default 200)")
    p.add_argument("--climb-every", type=options.whole, help="Hypothesis's target phase (hill-climbing the case "
                   f"with the worst error / bound) in one round in N per backend (default {CLIMB_EVERY}; 1 every "
                   "round, 0 never): a climb takes half its round, on one case")
    options.add(p, "compile-time-share", compile_time_share={"help": "for a backend that compiles kernels (FA4, "
                "FlashInfer, compiled flex, TE, cuDNN's graphs): the share of the time its fresh draws, which may "
                f"compile, get (default {COMPILE_TIME_SHARE}; 0: a fixed share of fresh draws, as runs have)"})
    p.add_argument("--round-seconds", type=options.positive, help="seconds per backend per round, shrinking included "
                   "(default 900): a slow or hanging backend cannot starve the others")
    p.add_argument("--no-isolate", action="store_true", help="run backends inside the lane (a crash costs a lane "
                   "restart and is saved as PROCESS_DIED)")
    options.add(p, "case-timeout", "max-len", "poison-memory", "skip-unavailable",
                case_timeout={"default": None, "shown_default": 120})
    p.add_argument("--replay-only", action="store_true", help="replay the database's failures once, draw nothing new")
    p.add_argument("--known", type=Path, help="a corpus whose known bugs are expected failures, beside the corpus "
                   "shipped with attnfuzz (default: the findings folder, see `attnfuzz run --help`)")


def _gpu_count() -> int:
    import torch
    return torch.cuda.device_count()


def new_config(args) -> dict:
    """campaign.json for a fresh campaign from the command line."""
    if not args.backends:
        raise CampaignError(f"--backends: name the backends to fuzz, e.g. --backends sdpa-math,flex-eager "
                            f"(`attnfuzz backends` lists them); {args.dir} holds no campaign to resume")
    device = args.device or "cpu"
    gpus = 0
    if device == "cuda":
        have = _gpu_count()
        gpus = have if args.gpus in (None, "all") else _positive("--gpus", args.gpus)
        if have == 0 or gpus > have:
            raise CampaignError(f"--gpus={args.gpus or 'all'}: this machine has {have} GPU(s) visible to torch")
    elif args.gpus:
        raise CampaignError("--gpus needs --device cuda; on cpu give --workers N")
    backends = [b for b in args.backends.split(",") if b]
    from attnfuzz.backends import get
    versions, skipped = {}, {}
    for name in backends:
        try:
            backend = get(name, device)
        except ValueError as e:
            raise CampaignError(f"--backends: {e}") from None
        why = backend.available()
        if why is None:
            versions[name] = backend.version()
        elif args.skip_unavailable:
            skipped[name] = why
        else:
            raise CampaignError(f"--backends: {name} cannot run here: {why} (or pass --skip-unavailable to skip it)")
    if not versions:
        raise CampaignError(f"--backends: none can run here: {skipped}")
    context_parallel = any(n.startswith(("ring-", "te-cp-")) for n in versions)
    sizing = None
    if device == "cuda":   # by default as many lanes per GPU as the host and the GPU hold (one for CP backends)
        per_gpu = args.workers or (1 if context_parallel else None)
        sizing = lanes_mod.size(lanes_mod.host_cores(), gpus, lanes_mod.gpu_memory_bytes(),
                                lanes_mod.host_memory_bytes(), per_gpu=per_gpu)
    lanes = gpus * sizing.per_gpu if sizing else args.workers or 1
    if device == "cuda" and lanes > 1 and context_parallel:
        raise CampaignError("context-parallel backends spread over every GPU themselves: give them a campaign of one "
                            "lane (--gpus 1; a single lane still sees all the GPUs)")
    if args.db and args.db.startswith(("redis://", "rediss://", "unix://")):
        _check_redis(args.db)
    return {"backends": list(versions), "skipped": skipped, "device": device, "lanes": lanes, "gpus": gpus,
            "sizing": sizing.describe(gpus) if sizing else None,
            "gpu_share": sizing.share_bytes if sizing and sizing.per_gpu > 1 else None,
            "hours": 1.0 if args.hours is None else args.hours,
            "db": args.db or "db", "round_examples": args.round_examples or 200,
            "round_seconds": args.round_seconds or 900.0, "isolate": not args.no_isolate,
            "climb_every": CLIMB_EVERY if args.climb_every is None else args.climb_every,
            "compile_time_share": COMPILE_TIME_SHARE if args.compile_time_share is None else args.compile_time_share,
            "case_timeout": args.case_timeout or 120.0, "max_len": args.max_len, "replay_only": args.replay_only,
            "poison_memory": args.poison_memory,
            "known": str(corpus_io.findings_dir(args.known).resolve()), "versions": versions,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _check_redis(url: str) -> None:
    try:
        import redis
    except ImportError:
        raise CampaignError(f"--db={url}: the redis client is not installed; pip install 'attnfuzz[redis]'") from None
    try:
        redis.Redis.from_url(url).ping()
    except redis.RedisError as e:
        raise CampaignError(f"--db={url}: no Redis answers there ({e}); start redis-server or fix the URL") from None


def _positive(option: str, value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise CampaignError(f"{option}={value!r}: give 'all' or a positive number")
    return int(value)


def resumed_config(args, stored: dict) -> dict:
    """The stored campaign, with --hours, --climb-every and --compile-time-share changed if given; any other option
    that differs is an error."""
    given = {"backends": args.backends and [b for b in args.backends.split(",") if b], "device": args.device,
             "db": args.db, "round_examples": args.round_examples, "round_seconds": args.round_seconds,
             "case_timeout": args.case_timeout, "max_len": args.max_len}
    for key, value in given.items():
        if value is not None and value != stored[key] and not (key == "backends" and
                                                               set(value) == set(stored[key]) | set(stored["skipped"])):
            raise CampaignError(f"--{key.replace('_', '-')}={value!r}: {args.dir} holds a campaign with {key} = "
                                f"{stored[key]!r}; resume it without the option, or give a new --dir")
    if args.hours is not None:
        stored["hours"] = args.hours
    if args.climb_every is not None:   # how often it climbs from here on; a campaign saved before had every round
        stored["climb_every"] = args.climb_every
    if args.compile_time_share is not None:
        stored["compile_time_share"] = args.compile_time_share
    if args.replay_only != stored["replay_only"]:
        stored["replay_only"] = args.replay_only
    return stored


def _die_with_parent() -> None:
    """In a lane (before exec): SIGKILL when the campaign process dies, even by kill -9 (Linux prctl)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def start_lane(campaign: Path, index: int, config: dict) -> subprocess.Popen:
    env = {**os.environ, **shared_cache_env()}   # every lane reads and fills the same compile caches
    if config.get("gpu_share"):   # lanes that share a GPU: each keeps to its share (attnfuzz.engine.memshare)
        env[memshare.ENV] = str(config["gpu_share"])
    if config["device"] == "cuda" and config["lanes"] > 1:
        gpus = config.get("gpus") or config["lanes"]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(gpus)))).split(",")
        env["CUDA_VISIBLE_DEVICES"] = visible[index % gpus]  # lane i on GPU i mod gpus
    log = (campaign / "state" / f"lane{index}.stderr").open("a")
    return subprocess.Popen([sys.executable, "-m", "attnfuzz.campaign.lane", str(campaign), str(index)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)


class Watch:
    """Reads the lanes' case logs as they grow: totals, cases/s over the last minute, failures by label."""

    def __init__(self, campaign: Path):
        self.dir, self.offsets, self.labels = campaign, {}, Counter()
        self.examples, self.recent, self.start = 0, [], time.perf_counter()
        self.coverage = Coverage()

    def poll(self) -> None:
        for path in sorted((self.dir / "cases").glob("lane*.jsonl")):
            with path.open() as f:
                f.seek(self.offsets.get(path, 0))
                while (line := f.readline()).endswith("\n"):
                    self.offsets[path] = f.tell()
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    self.add(row)

    def add(self, row: dict) -> None:
        self.examples += 1
        self.coverage.add(row["backend"], row["case"], row["label"])
        if row["label"] != "PASS" and row["label"] != "UNSUPPORTED":
            self.labels[row["label"]] += 1
        self.recent.append(time.perf_counter())

    def line(self) -> str:
        now = time.perf_counter()
        self.recent = [t for t in self.recent if now - t < 60]
        rate = len(self.recent) / min(60.0, max(now - self.start, 1e-9))
        found = ", ".join(f"{k} {v}" for k, v in self.labels.most_common(6)) or "none"
        return f"{self.examples} cases, {rate:.1f}/s; {self.coverage.summary()}; not passing: {found}"


def warm_command(name: str, device: str) -> list[str]:
    return [sys.executable, "-m", "attnfuzz.engine.warm", name, device]


def warm_limit_s(hours: float) -> float:
    """How long the warm-ups may take together: WARM_S, or a tenth of a shorter campaign (at least WARM_MIN_S)."""
    return min(WARM_S, max(WARM_MIN_S, hours * 3600 / 10))


def warm_jit_backends(config: dict) -> None:
    """Compile the plainest kernel configurations of each JIT backend once, each in a process of its own on the
    first GPU, all at once, before the lanes start (attnfuzz.engine.warm): the lanes then load them from the
    backends' disk caches instead of each compiling them at the same moment. A warm-up that fails is reported; one
    still running at warm_limit_s is stopped and reported (the lanes compile what it did not)."""
    from attnfuzz.backends import get
    from attnfuzz.engine.compiled_search import declares_compile_key
    env = dict(os.environ)
    if config["device"] == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    names = []
    for name in config["backends"]:
        try:
            backend = get(name, config["device"])
        except Exception:  # a custom spec that does not build here: the lanes report it
            continue
        if declares_compile_key(backend) and backend.compiles_to_disk:  # else nothing a lane could load
            names.append(name)
    limit = warm_limit_s(config.get("hours", 1.0))
    with tempfile.TemporaryDirectory(prefix="attnfuzz-warm-") as logs:
        started = {}
        for name in names:
            with open(Path(logs) / f"{len(started)}.log", "w") as log:   # a file, not a pipe: nothing blocks on it
                started[name] = (subprocess.Popen(warm_command(name, config["device"]), env=env, stdout=log,
                                                  stderr=subprocess.STDOUT), Path(log.name))
        deadline = time.perf_counter() + limit
        for name, (proc, log_path) in started.items():
            try:
                code = proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
                said = log_path.read_text(errors="replace").strip()
                print(said[-300:] or f"[{name}] warm-up exited with {code}", file=sys.stderr)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                print(f"[{name}] warm-up passed {limit:.0f} s; the lanes compile what it did not", file=sys.stderr)


class Restarts:
    """Which lanes that died are started again: any that logged a case since it last started, and one that did not
    until it has died RESTARTS times in a row so (a lane of a long campaign may die of many unrelated causes; one
    that dies at once whenever it starts would only loop)."""

    def __init__(self, campaign: Path):
        self.campaign, self.fruitless, self.logged = campaign, Counter(), {}

    def _log_size(self, lane: int) -> int:
        log = self.campaign / "cases" / f"lane{lane}.jsonl"
        return log.stat().st_size if log.exists() else 0

    def started(self, lane: int) -> None:
        self.logged[lane] = self._log_size(lane)

    def again(self, lane: int) -> bool:
        """Whether a lane that just died starts again (it is then counted as started)."""
        progressed = self._log_size(lane) > self.logged.get(lane, 0)
        self.fruitless[lane] = 0 if progressed else self.fruitless[lane] + 1
        if self.fruitless[lane] > RESTARTS:
            return False
        self.started(lane)
        return True


def run_campaign(args) -> int:
    campaign: Path = args.dir
    try:
        paths.writable_folder(campaign, "--dir")  # a file there, or no way to write: before anything starts
    except paths.PathError as e:
        raise CampaignError(str(e)) from None
    stored_path = campaign / "campaign.json"
    if stored_path.exists():
        config = resumed_config(args, json.loads(stored_path.read_text()))
        print(f"attnfuzz campaign: resuming {campaign}", file=sys.stderr)
    else:
        config = new_config(args)
    for sub in ("state", "cases", "corpus"):
        (campaign / sub).mkdir(parents=True, exist_ok=True)
    stored_path.write_text(json.dumps(config, indent=1) + "\n")
    for name, why in config["skipped"].items():
        print(f"[{name}] skipped: {why}", file=sys.stderr)
    if config.get("sizing"):
        print(f"attnfuzz campaign: {config['sizing']}", file=sys.stderr)
    before = {p.name for p in corpus_io.entry_paths(campaign / "corpus")}
    if config["lanes"] > 1:
        warm_jit_backends(config)
    restarts = Restarts(campaign)
    lanes = {}
    for i in range(config["lanes"]):
        restarts.started(i)
        lanes[i] = start_lane(campaign, i, config)
    watch = Watch(campaign)
    watch.poll()
    watch.examples, watch.labels, watch.recent = 0, Counter(), []  # rate and failures: this session; coverage: all
    tty = sys.stderr.isatty()
    last_print = 0.0
    try:
        while lanes:
            time.sleep(0.5)
            watch.poll()
            for i, proc in list(lanes.items()):
                code = proc.poll()
                if code is None:
                    continue
                del lanes[i]
                if code == 0:
                    continue
                if restarts.again(i):
                    print(f"\nattnfuzz campaign: lane {i} exited with {code}; restarting it (it resumes from its log; "
                          f"see {campaign}/state/lane{i}.stderr)", file=sys.stderr)
                    lanes[i] = start_lane(campaign, i, config)
                else:
                    print(f"\nattnfuzz campaign: lane {i} exited with {code}, {RESTARTS + 1} times in a row without a "
                          f"case; not restarted (see {campaign}/state/lane{i}.stderr)", file=sys.stderr)
            now = time.perf_counter()
            if now - last_print >= (1.0 if tty else 30.0):
                last_print = now
                sys.stderr.write(("\r" + watch.line()[:150].ljust(150)) if tty else watch.line() + "\n")
                sys.stderr.flush()
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (attnfuzz.engine.interrupt)
        # each lane stops as interrupted (its case in progress is not a finding) by the signal that stopped the
        # campaign: a Ctrl-C reaches the lanes directly too, and the first signal a lane gets is the one it names
        signum = getattr(e, "signum", signal.SIGINT)  # a bare KeyboardInterrupt is Python's own SIGINT handler's
        for proc in lanes.values():
            proc.send_signal(signum)
        for proc in lanes.values():  # let them finish: a lane dies with this process (PR_SET_PDEATHSIG)
            try:
                proc.wait(timeout=LANE_STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
        print(f"\nattnfuzz campaign: interrupted; run the same command to resume {campaign}", file=sys.stderr)
        return getattr(e, "exit_code", 130)
    watch.poll()
    print(("\n" if tty else "") + watch.line(), file=sys.stderr)
    found = corpus_io.entry_paths(campaign / "corpus")
    for path in found:
        print(f"  finding{'' if path.name in before else ' (new)'}: {path}{_unconfirmed(path)}", file=sys.stderr)
    try:
        print(f"report: {build_report(campaign)}", file=sys.stderr)
    except ImportError as e:
        print(f"no report: {e}; pip install matplotlib, then `attnfuzz report {campaign}`", file=sys.stderr)
    return 1 if found else 0


def _unconfirmed(path: Path) -> str:
    """What the end of a campaign adds to a finding saved without a rerun that reproduced it."""
    try:
        why = corpus_io.load(path).unconfirmed
    except corpus_io.CorpusError:
        return ""
    return f"  (UNCONFIRMED: {why}; `attnfuzz replay {path}` confirms or drops it)" if why else ""


def cmd_campaign(args) -> int:
    try:
        return run_campaign(args)
    except CampaignError as e:
        print(f"attnfuzz campaign: {e}", file=sys.stderr)
        return 2
