"""Write-ahead cases: the case a backend is running waits on disk, and the next start tells what left it there.

A fatal signal in process (the crash record attnfuzz.engine.interrupt writes beside the case names it) makes a
CRASH:PROCESS_DIED finding; anything else (a kill from outside, an isolated worker's case, a native exit()) keeps the
case under the findings folder's .stopped/, replayable and never a finding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from attnfuzz.engine import interrupt
from attnfuzz.oracles.verdict import CRASH, STOPPED, Verdict
from attnfuzz.store.corpus import DIED_UNCONFIRMED, Entry, describe_saved, save
from attnfuzz.strategies.case import Case


def inflight_path(directory: Path, backend: str) -> Path:
    """Where the case a backend is running waits on disk (write-ahead), one file per backend; its crash record is
    beside it (attnfuzz.engine.interrupt.record_path)."""
    return directory / f".inflight-{backend.replace(':', '_').replace('/', '_')}.json"


STOPPED_DIR = ".stopped"  # inside a corpus: cases a run was stopped on, kept for replay, never entries


@dataclass(frozen=True)
class Recovered:
    """What a start made of a case the last run left on disk: a CRASH:PROCESS_DIED finding (`finding`), or a
    stopped-case record under .stopped/ that is not one; `path` is the JSON saved, `message` what to tell the user."""

    path: Path
    finding: bool
    message: str


def recover_inflight(directory: Path, backend) -> list[Recovered]:
    """The case a run left on disk (write-ahead) in `directory` when it ended mid-case, judged by recover_case and
    removed with its crash record. Returns what was saved (none when no case was left)."""
    inflight = inflight_path(directory, backend.name)
    record_path = interrupt.record_path(inflight)
    recovered = []
    if inflight.exists():
        recovered.append(recover_case(inflight, interrupt.read_record(record_path), directory, backend))
    record_path.unlink(missing_ok=True)  # without a case, the process ended between cases: nothing to speak of
    return recovered


def recover_case(inflight: Path, record: interrupt.Record, directory: Path, backend,
                 device: str = "cpu") -> Recovered:
    """A write-ahead file left behind, and the crash record beside it. With a record naming a fatal signal (the
    process died of SIGSEGV, SIGABRT, ... in process) the case is saved in `directory` as a CRASH:PROCESS_DIED
    finding. Without one the process was stopped from outside (SIGKILL after a job's time limit, the OOM killer, a
    power loss; or it left through a native exit()), or the case ran in an isolated worker, which reports its own
    crashes: the case is kept under `directory`/.stopped/, replayable, and is not a finding. The file is removed."""
    try:
        data = json.loads(inflight.read_text())
        case = Case.from_dict(data["case"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        inflight.unlink()
        return Recovered(inflight, False, f"the last run left an unreadable write-ahead file ({e}); removed")
    device, isolated = data.get("device", device), bool(data.get("isolated"))
    if record.fatal is not None and not isolated:
        verdict = Verdict(CRASH, "PROCESS_DIED", f"the fuzzing process died of {record.fatal} while running this "
                          f"case (in process, without --isolate)", checks=(f"stack: {record.excerpt()}",))
        entry = Entry(backend=backend.name, case=case, verdict=verdict, device=device,
                      backend_version=backend.version(), unconfirmed=DIED_UNCONFIRMED)
        new = not (Path(directory) / entry.filename).exists()
        path = save(directory, entry)
        message = (f"the last run died of {record.fatal} while running a case, saved as a finding: "
                   + describe_saved(entry, path, new=new, shrunk=False))
        recovered = Recovered(path, True, message)
    else:
        if isolated:
            why = ("the run was killed from outside while an isolated worker ran this case (a worker's own crash "
                   "is reported as one, so this was not)")
        elif record.signalled:
            why = ("the run was sent SIGINT or SIGTERM while running this case, never got back from native code to "
                   "stop, and was killed later: the case may hang; where it was: " + record.excerpt(3))
        else:
            why = ("the run ended while running this case and left no crash record: killed from outside (SIGKILL "
                   "after a time limit, the OOM killer, a power loss) or gone through a native exit()")
        entry = Entry(backend=backend.name, case=case, verdict=Verdict(STOPPED, None, why), device=device,
                      backend_version=backend.version())
        path = save(Path(directory) / STOPPED_DIR, entry)
        message = "\n    ".join((
            "the last run stopped while running a case, and nothing shows that the case ended it; it is not "
            "counted as a finding", why, repr(case), f"kept at: {path}",
            f"replay: attnfuzz replay {path} --isolate   or   python3 {path.with_suffix('.py')}",
            f"if it fails there: attnfuzz shrink {path} --isolate   saves it to {directory} as a finding"))
        recovered = Recovered(path, False, message)
    inflight.unlink()
    return recovered
