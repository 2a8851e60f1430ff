"""The corpus: one JSON entry per distinct finding, named by a signature hash so duplicates merge.

Entry fields: schema, signature, backend, backend_version, device, environment, case, verdict, found, last_seen,
seen, known_bug (null, or a record of what failures count as this known bug: store/known.py). Optional: attached
([{"case": ..., "verdict": ...}]: the same root cause found under other labels in the run that saved the entry, each
a case and verdict; attnfuzz.engine.rootcause.merge_root_causes), absent from entries that have none; kernel_path (a
bring-your-own kernel's: the folder on sys.path its module was imported from, for replaying it from elsewhere);
confirmed (false, with unconfirmed_reason, on a failure saved without a rerun that reproduced it: a run stopped or out
of time before confirming it; absent once confirmed, by a run that finds it again or by `attnfuzz replay`).
`environment` records the CPU's vector ISA torch ran (cpu_capability); a CPU entry is replayed under it
(store/replay.py)."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from attnfuzz.store.known import known_bugs_of, record_problem
from attnfuzz.oracles.verdict import CRASH, FLAKY, HANG, Verdict
from attnfuzz.strategies.case import SCHEMA, Case
from attnfuzz.strategies.lengths import work

REQUIRED = ("schema", "signature", "backend", "case", "verdict")

# Why a failure was saved unconfirmed (Entry.unconfirmed)
STOPPED_UNCONFIRMED = "the run was stopped before it reran this failure to confirm it"
MET_UNCONFIRMED = "met on the way to the shrunk finding: graded once, never rerun"
OUT_OF_TIME_UNCONFIRMED = "time ran out before its shrink and its confirming reruns"
DIED_UNCONFIRMED = "the process died while running it: not rerun"


class CorpusError(ValueError):
    """A corpus file that cannot be read; the message names the file and the field."""


@dataclass
class Entry:
    backend: str
    case: Case
    verdict: Verdict
    device: str = "cpu"
    backend_version: str = ""
    environment: dict | None = None
    found: str = ""
    last_seen: str = ""
    seen: int = 1
    known_bug: dict | None = None
    attached: list[tuple[Case, Verdict]] = field(default_factory=list)  # other labels of the same root cause
    kernel_path: str | None = None  # a bring-your-own kernel's import folder (store/replay.py's backend_of)
    unconfirmed: str | None = None  # why the failure was saved without a rerun that reproduced it; None: confirmed

    @property
    def signature(self) -> str:
        """backend + verdict label + the case without its seed: the same bug drawn with other numbers merges."""
        shape = {k: v for k, v in self.case.to_dict().items() if k != "seed"}
        key = json.dumps([self.backend, self.verdict.label, shape], sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    @property
    def filename(self) -> str:
        label = self.verdict.label.replace(":", "-")
        return f"{self.backend}-{label}-{self.signature}.json".replace("/", "_").replace(":", "_")

    def recorded_isa(self, device: str) -> str | None:
        """The vector ISA a CPU entry was found under (ATen's name, e.g. "AVX2"); None for an entry replayed on a GPU or
        saved before attnfuzz recorded it."""
        if not device.startswith("cpu"):
            return None
        return (self.environment or {}).get("cpu_capability") or None

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "signature": self.signature, "backend": self.backend,
                "backend_version": self.backend_version, "device": self.device, "environment": self.environment,
                "case": self.case.to_dict(), "verdict": self.verdict.to_dict(), "found": self.found,
                "last_seen": self.last_seen, "seen": self.seen, "known_bug": self.known_bug,
                **({"attached": [{"case": c.to_dict(), "verdict": v.to_dict()} for c, v in self.attached]}
                   if self.attached else {}),
                **({"kernel_path": self.kernel_path} if self.kernel_path else {}),
                **({"confirmed": False, "unconfirmed_reason": self.unconfirmed} if self.unconfirmed else {})}

    @classmethod
    def from_dict(cls, data, where: str) -> Entry:
        if not isinstance(data, dict):
            raise CorpusError(f"{where}: expected a JSON object, got {type(data).__name__}")
        for name in REQUIRED:
            if name not in data:
                raise CorpusError(f"{where}: missing field {name!r}")
        if data["schema"] != SCHEMA:
            raise CorpusError(f"{where}: field 'schema' is {data['schema']!r}; this attnfuzz reads schema {SCHEMA}")
        if not isinstance(data["backend"], str) or not data["backend"]:
            raise CorpusError(f"{where}: field 'backend' must be a backend name, got {data['backend']!r}")
        try:
            case = Case.from_dict(data["case"], where=f"{where}: field 'case'")
        except ValueError as e:
            raise CorpusError(str(e)) from None
        try:
            verdict = Verdict.from_dict(data["verdict"])
        except (KeyError, TypeError, ValueError) as e:
            raise CorpusError(f"{where}: field 'verdict' is malformed ({type(e).__name__}: {e})") from None
        known = data.get("known_bug")
        problem = record_problem(known, case)
        if problem is not None:
            raise CorpusError(f"{where}: {problem}")
        attached = data.get("attached", [])
        if not isinstance(attached, list) or not all(isinstance(a, dict) for a in attached):
            raise CorpusError(f"{where}: field 'attached' must be a list of {{'case': ..., 'verdict': ...}} objects")
        try:
            attached = [(Case.from_dict(a["case"], where=f"{where}: field 'attached[{i}].case'"),
                         Verdict.from_dict(a["verdict"])) for i, a in enumerate(attached)]
        except (KeyError, TypeError, ValueError) as e:
            raise CorpusError(f"{where}: field 'attached' is malformed ({type(e).__name__}: {e})") from None
        kernel_path = data.get("kernel_path")
        if kernel_path is not None and not isinstance(kernel_path, str):
            raise CorpusError(f"{where}: field 'kernel_path' must be a folder's path, got {kernel_path!r}")
        confirmed, reason = data.get("confirmed", True), data.get("unconfirmed_reason")
        if not isinstance(confirmed, bool) or not isinstance(reason, (str, type(None))):
            raise CorpusError(f"{where}: field 'confirmed' must be true or false and 'unconfirmed_reason' a "
                              f"sentence, got {confirmed!r} and {reason!r}")
        return cls(backend=data["backend"], case=case, verdict=verdict, device=data.get("device", "cpu"),
                   backend_version=data.get("backend_version", ""), environment=data.get("environment"),
                   found=data.get("found", ""), last_seen=data.get("last_seen", ""), seen=data.get("seen", 1),
                   known_bug=known, attached=attached, kernel_path=kernel_path,
                   unconfirmed=None if confirmed else reason or "saved unconfirmed")


def environment(device: str) -> dict:
    """Where an entry was found: versions, the GPU, and the CPU's vector ISA torch's CPU kernels and inductor's C++
    ran with (ATen's capability, and ATEN_CPU_CAPABILITY when it was set to choose one)."""
    import hypothesis
    import torch
    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "hypothesis": hypothesis.__version__, "cpu_capability": host_isa()}
    if os.environ.get("ATEN_CPU_CAPABILITY"):
        env["ATEN_CPU_CAPABILITY"] = os.environ["ATEN_CPU_CAPABILITY"]
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
        env["cuda"] = torch.version.cuda
    return env


def host_isa() -> str:
    """The vector ISA torch's CPU kernels dispatch to in this process ("AVX2", "AVX512", "DEFAULT", ...): chosen
    once, when torch loads, from the CPU and ATEN_CPU_CAPABILITY. Inductor's CPU code follows the same variable."""
    import torch
    return torch.backends.cpu.get_cpu_capability()


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def save(directory: Path, entry: Entry, *, repro: bool = True) -> Path:
    """Write (or merge into) the entry's file, and its standalone repro script beside it. Returns the JSON path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / entry.filename
    stamp = now()
    if path.exists():
        try:  # the same bug again: keep the first case (its repro script stays valid), count the sighting
            first = Entry.from_dict(json.loads(path.read_text()), str(path))
            first.seen, first.last_seen = first.seen + 1, stamp
            _attach(first, entry.attached)  # and keep a label it came with that the entry lacks
            if entry.unconfirmed is None:  # a confirmed sighting confirms the entry; an unconfirmed one adds nothing
                first.unconfirmed = None
            entry.unconfirmed = first.unconfirmed  # what the caller tells of it is what the file holds
            path.write_text(json.dumps(first.to_dict(), indent=2, sort_keys=True) + "\n")
            return path
        except (CorpusError, ValueError):  # not JSON, not UTF-8
            pass  # an unreadable old file is replaced by the fresh finding
    entry.found = entry.found or stamp
    entry.last_seen = stamp
    entry.environment = entry.environment or environment(entry.device)
    if entry.kernel_path is None and ":" in entry.backend:  # a bring-your-own kernel: where its module came from
        entry.kernel_path = _import_folder(entry)
    path.write_text(json.dumps(entry.to_dict(), indent=2, sort_keys=True) + "\n")
    if repro:
        from attnfuzz.store.repro import write_repro
        write_repro(entry, path.with_suffix(".py"))
    return path


def _attach(entry: Entry, pairs) -> None:
    """Add to the entry's `attached` each (case, verdict) of a label it has neither as its own nor attached."""
    labels = {entry.verdict.label, *(v.label for _, v in entry.attached)}
    for case, verdict in pairs:
        if verdict.label not in labels:
            entry.attached.append((case, verdict))
            labels.add(verdict.label)


def attach(path: Path, pairs) -> None:
    """Attach (case, verdict) pairs of the same root cause to the saved entry at `path` (store.corpus._attach)."""
    entry = load(path)
    _attach(entry, pairs)
    path.write_text(json.dumps(entry.to_dict(), indent=2, sort_keys=True) + "\n")


def _import_folder(entry: Entry) -> str | None:
    """The folder on sys.path that this process imported a bring-your-own kernel's module from (replay's fallback)."""
    from attnfuzz.backends import get
    try:
        return getattr(get(entry.backend, entry.device), "import_path", None)
    except ValueError:
        return None


class AsFound:
    """The smallest failing case of each label a run grades (by the oracle's work, the earliest among equals; `see` is
    an on_case callback), so that a run stopped before its search ends (a time limit while it shrinks, Ctrl-C) still
    saves what it found, as far as the shrink had taken it."""

    def __init__(self, backend: str, device: str, backend_version: str = ""):
        self.backend, self.device, self.backend_version = backend, device, backend_version
        self.failures: dict[str, tuple[Case, Verdict]] = {}

    def see(self, case: Case, verdict: Verdict, *_) -> None:
        kept = self.failures.get(verdict.label)
        if verdict.failed and (kept is None or work(case) < work(kept[0])):
            self.failures[verdict.label] = (case, verdict)

    def besides(self, findings) -> AsFound:
        """Those of its failures whose label no finding reports (a finding's own label, the label a FLAKY one was
        found with, a label it attached as the same root cause): with --first-bug, the failures the search met on
        its way to the one it shrank, which the run saves as found so that none is lost."""
        reported = {label for f in findings for label in (f.verdict.label, f.verdict.diagnosis if
                    f.verdict.status == FLAKY else None, *(v.label for _, v in f.attached)) if label}
        rest = AsFound(self.backend, self.device, self.backend_version)
        rest.failures = {label: kept for label, kept in self.failures.items() if label not in reported}
        return rest

    def save(self, directory: Path, unconfirmed: str) -> list[tuple[Path, str]]:
        """Each failure saved, unconfirmed for the reason given (it was graded once): its file and what
        describe_saved says of it."""
        saved = []
        for case, verdict in self.failures.values():
            entry = Entry(backend=self.backend, case=case, verdict=verdict, device=self.device,
                          backend_version=self.backend_version, unconfirmed=unconfirmed)
            new = not (directory / entry.filename).exists()
            path = save(directory, entry)
            saved.append((path, describe_saved(entry, path, new=new, shrunk=False)))
        return saved


def replays_isolated(verdict: Verdict) -> bool:
    """Whether an entry's case should be replayed in a worker: a hang, or a crash that kills or poisons a process."""
    return verdict.status == HANG or (verdict.status == CRASH and (verdict.diagnosis or "").startswith(
        ("SIG", "EXIT_", "PROCESS_DIED", "CUDA_")))


def describe_saved(entry: Entry, path: Path, *, new: bool = True, shrunk: bool = True) -> str:
    """What a user needs of a saved finding, one item a line: its label and message, its case, where its JSON and
    repro script are, and the commands to replay it (and to shrink it, when its shrink did not end)."""
    isolate = " --isolate" if replays_isolated(entry.verdict) else ""
    script = path.with_suffix(".py")
    lines = [f"{entry.verdict.label}: {entry.verdict.message}", f"    {entry.case!r}",
             f"    saved:  {path}" + ("" if new else "  (the same bug as this entry, seen before: sighting counted)")]
    if script.exists():
        lines.append(f"    repro:  {script}")
    lines.append(f"    replay: attnfuzz replay {path}{isolate}" + (f"   or   python3 {script}" if script.exists() else ""))
    if entry.unconfirmed:
        lines.append(f"    UNCONFIRMED: {entry.unconfirmed}; `attnfuzz replay {path}{isolate}` confirms it, or drops "
                     f"it when it does not fail so again")
    if not shrunk:
        lines.append(f"    shrink: attnfuzz shrink {path} --isolate   (no shrink of this case ran to its end)")
    for case, verdict in entry.attached:
        why = (f"every such output of the run matched {entry.verdict.diagnosis} too" if entry.verdict.diagnosis in
               verdict.also else "its case and this one, with probe values, count the same wrong keys")
        lines.append(f"    also {verdict.label}, the same root cause ({why}): {case!r}")
    return "\n".join(lines)


def load(path: Path) -> Entry:
    """One entry; CorpusError names the file and the field when it cannot be read."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CorpusError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise CorpusError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}), so not a "
                          f"corpus entry") from None
    except OSError as e:
        raise CorpusError(f"{path}: cannot be read ({e.strerror})") from None
    return Entry.from_dict(data, str(path))


def entry_paths(directory: Path) -> list[Path]:
    """The entries under `directory`; names and folders starting with "." are not entries (write-ahead files, the
    stopped-case records in .stopped/)."""
    directory = Path(directory)
    return sorted(p for p in directory.glob("**/*.json")
                  if not any(part.startswith(".") for part in p.relative_to(directory).parts))


def load_all(directory: Path) -> tuple[list[tuple[Path, Entry]], list[CorpusError]]:
    """Every readable entry under `directory`, and an error per unreadable file (the others still load)."""
    entries, errors = [], []
    for path in entry_paths(directory):
        try:
            entries.append((path, load(path)))
        except CorpusError as e:
            errors.append(e)
    return entries, errors


def shipped_dir() -> Path:
    """The corpus that ships with attnfuzz: the repository's corpus/ folder, installed as attnfuzz.shipped_corpus;
    $ATTNFUZZ_SHIPPED_CORPUS names another folder in its place (a team's curated corpus, or an empty one to time how
    a run finds a bug the shipped corpus already knows)."""
    if os.environ.get("ATTNFUZZ_SHIPPED_CORPUS"):
        return Path(os.environ["ATTNFUZZ_SHIPPED_CORPUS"])
    from importlib.resources import files
    return Path(str(files("attnfuzz.shipped_corpus")))


def findings_dir(given: Path | None = None) -> Path:
    """Where a run saves its findings: the folder given, else $ATTNFUZZ_CORPUS, else the per-user data folder
    ($XDG_DATA_HOME/attnfuzz/corpus, ~/.local/share/attnfuzz/corpus). Never the shipped corpus unless named."""
    if given is not None:
        return Path(given)
    if os.environ.get("ATTNFUZZ_CORPUS"):
        return Path(os.environ["ATTNFUZZ_CORPUS"])
    data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data) / "attnfuzz" / "corpus"


def known_bugs(*directories: Path):
    """The `known` predicate (store/known.py's known_bugs_of) over the entries of every folder given (each read once;
    a folder that does not exist holds none). An unreadable file raises CorpusError naming it: skipping it would drop
    its known bug without a word, and its failures would be reported as new."""
    entries, errors, seen = [], [], set()
    for directory in directories:
        directory = Path(directory).resolve()
        if directory in seen or not directory.exists():
            continue
        seen.add(directory)
        found, bad = load_all(directory)
        entries += found
        errors += bad
    if errors:
        raise CorpusError("; ".join(str(e) for e in errors) + " (fix or move away the file: a corpus file that "
                          "cannot be read would drop its known bug)")
    return known_bugs_of(entries)
