"""An issue-ready bug report from one corpus entry: `attnfuzz report-bug ENTRY [--device D] [--out FILE] [--isolate]`.

Markdown a kernel maintainer can act on: a title and summary in plain words, the known bug's link, expected vs got at
the worst element against the bound, the case as a table, which backends and spellings agree on the same case, the
entry's repro script inline with how to run it, and the environment (recorded, beside this host's). The agreement
table is run, not recalled: the entry's backend in every spelling it takes (to confirm it still fails here), and every
other registered backend that can take the case on this device, each graded against the float64 oracle, within
--budget seconds in all and --backend-limit each (attnfuzz.tools.crosscheck). Context-parallel backends run only for
a context-parallel entry. Every registered backend is named: a row of the table where it ran (the entry's own
always), else in one line per kind of reason it did not (not run: cannot take the case, not installed, cannot run on
this device, over the time budget). The case table lists every Case field set, beside the readable rows. The report names no folder of
this machine: files by their names, a bring-your-own kernel as module:function, any other path relative to the
current folder or under ~.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import re
import sys
from pathlib import Path

from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import paths
from attnfuzz.engine import options
from attnfuzz.tools.bugwords import (features, joined, library, now_sentence, num, others_sentence, shape,
                                     what_went_wrong)
from attnfuzz.tools.crosscheck import CANNOT, NOT_RUN, OVER_BUDGET, Row, cross_check
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

AXES = {"out": "batch, query, head, channel", "dq": "batch, query, head, channel", "dk": "batch, key, KV head, channel",
        "dv": "batch, key, KV head, channel", "lse": "batch, head, query"}
SCRIPT_LIMIT = 60_000  # characters of script an issue body can carry; past it, long literal lines are elided


def add_parser(sub) -> None:
    p = sub.add_parser("report-bug", help="write an issue-ready markdown report of a corpus entry, its case rerun "
                       "through every backend that can run here")
    p.add_argument("entry", type=Path, help="a corpus entry (.json), with its repro script (.py) beside it")
    p.add_argument("--out", type=Path, help="write the report here (default: stdout)")
    options.add(p, "device", "isolate", "case-timeout", "budget", "backend-limit", case_timeout={"default": 120.0},
                device={"default": None, "help": "cpu, cuda or cuda:N (default: the entry's, else cpu where it has "
                                                 "no GPU)"},
                isolate={"help": "run each backend in a worker process; an entry that crashed or hung runs its own "
                                 "backend in one anyway"})


def cmd_report_bug(args) -> int:
    import torch
    try:
        entry = corpus_io.load(args.entry)
    except corpus_io.CorpusError as e:
        print(f"attnfuzz report-bug: {e}; give a corpus entry's .json file", file=sys.stderr)
        return 2
    if args.out:
        paths.writable_file(args.out, "--out", "bug.md")  # before the cross-check runs every backend
    device, moved = args.device or entry.device, ""
    if device.startswith("cuda") and not torch.cuda.is_available():
        if args.device:
            print(f"attnfuzz report-bug: --device={device!r}: this torch ({torch.__version__}) sees no CUDA device; "
                  f"use --device cpu", file=sys.stderr)
            return 2
        device = "cpu"
        moved = f"The entry was found on {entry.device}; this machine has no CUDA device, so the case ran on the CPU."
    rows = cross_check(entry, device, isolate=args.isolate, timeout_s=args.case_timeout,
                       known=corpus_io.known_bugs(args.entry.parent), budget_s=args.budget,
                       backend_s=args.backend_limit)
    text = render(entry, args.entry, device, moved, rows)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _table(header: list[str], rows: list[list[str]], limit: int | None = 240) -> str:
    """A markdown table; a cell past `limit` characters is cut (None: never)."""
    def cell(text) -> str:
        text = " ".join(str(text).split()).replace("|", "\\|")
        return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows])


def result(row: Row) -> str:
    v = row.verdict
    if row.outcome == V.PASS or (row.outcome == V.FAIL and v.ratio < math.inf):
        return f"{'PASS' if v.status == V.PASS else f'**{v.label}**'} ({num(v.ratio)})"
    if row.outcome == V.FAIL:  # all-zero and non-finite outputs are failed without a ratio
        return f"**{v.label}**"
    if row.outcome == OVER_BUDGET:
        return f"{NOT_RUN}: {OVER_BUDGET}: {row.detail}"
    return f"**{v.label}**: {row.detail}" if v is not None and v.failed else f"{row.outcome}: {row.detail}"


# -- the report --------------------------------------------------------------------------------------------------

def _worst_row(entry: corpus_io.Entry, where: str, verdict: V.Verdict) -> list[str]:
    """A row of expected vs got: the bound from the verdict's ratio, or the oracle's where the ratio carries none
    (an all-zero or non-finite output is failed without one)."""
    w, ratio = verdict.worst, verdict.ratio
    error, bound = abs(w.got - w.expected), math.nan
    if 0 < ratio < math.inf and math.isfinite(error):
        bound = error / ratio
    elif w.tensor in ("out", "dq", "dk", "dv"):
        from attnfuzz.oracles.grade import Oracle, check_out, gradient_check
        from attnfuzz.store.repro_bounds import get_family
        from attnfuzz.strategies.materialize import draw_on_cpu
        o, family = Oracle.of(entry.case, draw_on_cpu(entry.case)), get_family(entry)
        bound = (check_out(o, o.ref.out, o.ref.out, family) if w.tensor == "out"
                 else gradient_check(o, w.tensor, getattr(o.ref, w.tensor), family)).bound
        ratio = error / bound if bound > 0 and math.isfinite(error) else math.inf
    return [where, w.tensor, f"{list(w.index)} ({AXES.get(w.tensor, '')})", num(w.got), num(w.expected),
            num(error), "-" if bound != bound else num(bound), num(ratio)]


def went_wrong(entry: corpus_io.Entry, own: Row, found_on: str) -> list[str]:
    saved, now = entry.verdict, own.verdict
    lines = ["## What went wrong", "", f"**{saved.label}**: {what_went_wrong(saved)[1]}.", "",
             f"Message when found: `{saved.message}`"]
    lines += ["", f"Message here, now: `{now.message}`"] if now and now.failed and now.message != saved.message else []
    rows = [_worst_row(entry, f"when found ({found_on})", saved)] if saved.worst else []
    rows += [_worst_row(entry, "here, now", now)] if now is not None and now.worst is not None else []
    if rows:
        lines += ["", "Expected (float64 oracle) vs got at the worst element. The bound is what a correct kernel's "
                  "rounding in this dtype may reach (k x the naive same-dtype error + a rounding floor); the case "
                  "fails when error / bound > 1.", "",
                  _table(["", "tensor", "index", "got", "expected", "error", "bound", "error / bound"], rows)]
    else:
        lines += ["", "No element to compare: the call returned no output."]
    return lines + (["", "Other checks when found:", ""] + [f"- `{c}`" for c in saved.checks] if saved.checks else [])


def case_table(case: Case) -> str:
    mask = features(case)[0].removeprefix("attention with ").replace("unmasked attention", "none")
    lens = f"query {list(case.lens_q)}, key {list(case.lens_kv)}"
    rows = [["shapes", f"q [b={case.b}, sq={case.sq}, h={case.h}, d_qk={case.d_qk}], k [{case.b}, skv={case.skv}, "
                       f"hk={case.hk}, {case.d_qk}], v [{case.b}, {case.skv}, {case.hk}, d_v={case.d_v}]"],
            ["dtype", case.dtype],
            ["sequence lengths", f"{lens} (padded batch)" if case.padded else f"{lens} (every sequence full)"],
            ["mask", mask.replace(" attention", "") + ("" if case.causal or case.window == (None, None)
                                                      else " (None = unbounded)")],
            ["layout, memory", f"{case.layout}, {case.memory}" + ("" if case.storage == ("plain",) * 3 else
                                                                  f"; storage q, k, v: {', '.join(case.storage)}")],
            ["softcap / ALiBi / softmax", f"{case.softcap or 'no softcap'} / "
                                          f"{list(case.alibi_slopes) if case.alibi_slopes else 'no ALiBi'} / "
                                          f"{case.softmax}"],
            ["scale", f"{case.softmax_scale:.6g}" + (" (1/sqrt(d_qk))" if case.scale is None else "")],
            ["inputs", f"seed {case.seed}; mean {list(case.mean)}, std {list(case.std)} for (q, k, v)"],
            ["gradients", "dQ, dK, dV graded" if case.grads else "no (forward only)"],
            ["spelling", repr(case.spelling) + ("" if case.spelling else " (the adapter's default)")],
            ["every field set (the others at their defaults)", ", ".join(f"`{x}`" for x in set_fields(case))]]
    return _table(["", "case"], rows, limit=None)


def set_fields(case: Case) -> list[str]:
    """`name=value` of each Case field that differs from its default, in the dataclass's order: a field Case gains
    shows up without a word here."""
    return [f"{f.name}={getattr(case, f.name)!r}" for f in dataclasses.fields(case)
            if getattr(case, f.name) != f.default]


def cross_table(rows: list[Row], device: str, moved: str) -> list[str]:
    intro = (f"The same case (same seed: the same inputs) run now on {device} through the entry's backend in every "
             f"spelling it takes, and through every other registered backend, each graded against the float64 "
             f"oracle. A spelling is how the call expresses the case in that backend's API. Those that could not take "
             f"the case, or that the time budget left out, follow the table, one line per reason. {moved}")
    kept = [r for r in rows if _left_out(r, device) is None]
    body = [[f"**{r.backend}**" if r.own else r.backend, r.spelling, r.version or "-", result(r), r.note] for r in kept]
    return ["## Other backends and spellings on the same case", "", intro.strip(), "",
            _table(["backend", "spelling", "version", "result (error / bound)", "note"], body), "",
            *folded(rows, device)]


def _left_out(row: Row, device: str) -> str | None:
    """Why another backend did not run the case, as a kind of reason (a line of `folded`); None for a row that
    ran, and for the entry's own backend, which keeps its rows."""
    if row.own or row.outcome not in (CANNOT, NOT_RUN, OVER_BUDGET, V.UNSUPPORTED):
        return None
    if row.outcome == CANNOT:
        return f"{NOT_RUN}: " + ("not installed" if row.version == "not installed" else f"cannot run on {device}")
    kinds = {V.UNSUPPORTED: f"{NOT_RUN}: cannot take the case", OVER_BUDGET: f"{NOT_RUN}: {OVER_BUDGET}"}
    return kinds.get(row.outcome, NOT_RUN)


def folded(rows: list[Row], device: str) -> list[str]:
    """The backends that did not run the case, one line per kind of reason, each backend's own reason beside it
    (backends with the same reason share it)."""
    kinds: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        kind = _left_out(r, device)
        if kind is None:
            continue
        why = re.sub(rf"^{re.escape(r.backend)}:? ", "", r.detail)
        why = why if len(why) <= 160 else why[:157] + "..."
        name = r.backend if r.spelling in ("-", "every spelling") or r.spelling.startswith("default") \
            else f"{r.backend} [{r.spelling}]"
        kinds.setdefault(kind, {}).setdefault(why, []).append(name)
    return [f"- {kind}: " + "; ".join(", ".join(dict.fromkeys(names)) + (f" ({why})" if why else "")
                                      for why, names in groups.items()) for kind, groups in kinds.items()]


def repro_section(entry: corpus_io.Entry, path: Path) -> list[str]:
    from attnfuzz.store.repro import kernel_module, script
    script_path = path.with_suffix(".py")
    text = script_path.read_text() if script_path.exists() else None
    if text is not None and "\nKERNEL_PATH = " not in text:
        where = f"`{script_path.name}` (beside the entry)"
    elif text is not None:  # written by an older attnfuzz, with the kernel's folder on this machine in it
        text, where = script(entry), f"`{script_path.name}` (written now: the one beside the entry names a folder)"
    else:
        text, where = script(entry), f"`{script_path.name}` (not beside the entry: written now)"
    lib = library(entry.backend)[0]
    needs = "torch" + ("" if lib in ("", "torch") else f" and {lib}")
    if "from attnfuzz" in text:
        needs += ", and attnfuzz importable (it calls the adapter or regenerates large inputs from the seed)"
    module = kernel_module(entry)
    if module:
        needs += (f", and the kernel's module: run it from the folder where `import {module}` works, or with that "
                  f"folder on PYTHONPATH")
    lse = entry.verdict.diagnosis == V.LSE
    returns_lse = "RETURNS_LSE = True" in text or "through attnfuzz's adapter" in text  # the adapter's, graded
    lines = ["## Repro", "", f"{where} needs only {needs}, and "
             + ("a CUDA device" if entry.device.startswith("cuda") else "the CPU") + f" (`DEVICE = {entry.device!r}`). "
             "It carries the inputs and the float64 answers inline and checks the output"
             + (", the LSE" if lse and returns_lse else "") + (" and dQ / dK / dV" if entry.case.grads else "")
             + " against them:", "", "```bash",
             f"python3 {script_path.name}; echo \"exit status $?\"", "```", "",
             "Exit status 0: within the bound, the bug is not there. 1: the bug is there; it prints the error against "
             "the bound and what failed (a wrong shape, non-finite output, all-zero output, error over the bound). An "
             "exception inside the library also exits 1, with its traceback; a process killed by a signal shows as "
             "128 + the signal (139 for SIGSEGV)."]
    if lse and not returns_lse:
        lines += ["", f"**The script does not check the LSE**: it exits 0 while this bug is there; "
                      f"`attnfuzz replay {path.name}` checks it."]
    if entry.backend.startswith(("te-cp-", "ring-")):
        lines += ["", "The script spawns its own ranks and checks the gathered output only (no gradients)."]
    if entry.verdict.status == V.HANG:
        lines += ["", "It gives up after ATTNFUZZ_REPRO_WATCHDOG seconds (900) and exits 1."]
    if len(text) > SCRIPT_LIMIT:
        lines += ["", f"The script is {len(text):,} characters, too long for an issue: its inline tensor data is "
                      f"elided below. Attach the file itself."]
        text = "\n".join(ln if len(ln) <= 400 else f"{ln[:100]} ... <{len(ln) - 130:,} characters elided> ... "
                         f"{ln[-30:]}" for ln in text.splitlines())
    fence = "````" if "```" in text else "```"
    return lines + ["", f"{fence}python", text.rstrip(), fence]


def environment_table(entry: corpus_io.Entry, own: Row) -> list[str]:
    import hypothesis
    import torch
    rec, on_cpu = entry.environment or {}, "none: found on the CPU" if entry.device == "cpu" else None
    try:
        cpus = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")]
    except OSError:
        cpus = []
    lib = library(entry.backend)[0]
    rows = [("python", rec.get("python"), platform.python_version()),
            ("platform", rec.get("platform"), platform.platform()),
            ("CPU", None, f"{cpus[0]} ({len(cpus)} logical CPUs)" if cpus else platform.machine()),
            ("torch", rec.get("torch"), torch.__version__),
            ("CUDA", rec.get("cuda") or on_cpu, torch.version.cuda or "none (a CPU build of torch)"),
            ("GPU", rec.get("gpu") or on_cpu, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")]
    rows += [(lib, entry.backend_version, own.version or "not installed")] if lib not in ("", "torch") else []
    rows += [("hypothesis", rec.get("hypothesis"), hypothesis.__version__)]
    body = [[name, then or "not recorded", "same" if then == now else now] for name, then, now in rows]
    return ["## Environment", "", _table(["", f"when found ({entry.found or 'date not recorded'})", "here, now"], body)]


def render(entry: corpus_io.Entry, path: Path, device: str, moved: str, rows: list[Row]) -> str:
    own = next(r for r in rows if r.own)
    phrase, why = what_went_wrong(entry.verdict)
    kind, rest = features(entry.case)
    rec = entry.environment or {}
    found_on = rec.get("gpu") or ("the CPU" if entry.device == "cpu" else entry.device)
    lib, what = library(entry.backend)
    version = entry.backend_version  # "2.20.2", or "transformer_engine 2.20.2, torch 2.11.0" (context parallel)
    if version and " " not in version and what.startswith(lib):
        what, version = f"{lib} {version}{what[len(lib):]}", ""
    about = "; ".join(x for x in (what, version) if x)
    summary = (f"{entry.backend}{f' ({about})' if about else ''} {phrase} ({entry.verdict.label}) for {kind}"
               f"{' with ' + joined(rest) if rest else ''}, in {shape(entry.case)}. {why[0].upper()}{why[1:]}. "
               f"Found by attnfuzz on {found_on} with torch {rec.get('torch', '(version not recorded)')}"
               f"{' on ' + entry.found[:10] if entry.found else ''}. {now_sentence(entry, own, device)} "
               f"{others_sentence(entry, rows)}")
    parts = [f"# {entry.backend} {phrase} for {kind} ({shape(entry.case)})", "", summary]
    if entry.known_bug:
        bug = entry.known_bug
        parts += ["", "## Known bug", "", f"Tracked at {bug['link']}" + (f": {bug['note']}" if bug.get("note") else "")]
    parts += ["", *went_wrong(entry, own, found_on), "", "## The case", "", case_table(entry.case), "",
              *cross_table(rows, device, moved), "", *repro_section(entry, path), "",
              *environment_table(entry, own), "", f"<sub>Corpus entry `{path.name}` (signature {entry.signature}): "
              f"first found {entry.found or '?'}, last seen {entry.last_seen or '?'}, seen {entry.seen} "
              f"time{'s' * (entry.seen != 1)}.</sub>", ""]
    return without_local_folders("\n".join(parts))


def without_local_folders(text: str) -> str:
    """`text` naming no folder of this machine, for a report read on others: a path under the current folder made
    relative to it (./x), one under the home folder written ~/x (the most specific folder first)."""
    folders = {}
    for path, name in ((Path.cwd(), "."), (Path.home(), "~")):
        for folder in (str(path), os.path.realpath(path)):
            if folder != os.sep:
                folders.setdefault(folder, name)
    for folder in sorted(folders, key=len, reverse=True):
        text = re.sub(re.escape(folder) + r"(?![\w.-])", folders[folder], text)
    return text
