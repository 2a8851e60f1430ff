"""An issue-ready bug report from one corpus entry: `attnfuzz report-bug ENTRY [--device D] [--out FILE] [--isolate]`.

Markdown a kernel maintainer can act on: a title and summary in plain words, the known bug's link, expected vs got at
the worst element against the bound, the case as a table, which backends and spellings agree on the same case, the
entry's repro script inline with how to run it, and the environment (recorded, beside this host's). The agreement
table is run, not recalled: the entry's backend in every spelling it takes (to confirm it still fails here), and every
other registered backend that can run on this device, each graded against the float64 oracle. Context-parallel
backends run only for a context-parallel entry; every registered backend gets a row.
"""

from __future__ import annotations

import math
import platform
import sys
from pathlib import Path

from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import paths
from attnfuzz.engine import options
from attnfuzz.tools.crosscheck import Row, cross_check, saved_label
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

# What each diagnosis means, in a maintainer's words: (a phrase for the title, the explanation).
EXPLAIN = {
    V.ALL_ZERO: ("returns an all-zero output", "every graded output element is 0 where the exact answer is not"),
    V.NONFINITE: ("returns NaN or inf", "the output holds NaN or inf where the exact answer is finite"),
    V.EMPTY_ROWS: ("gets rows that see no key wrong", "only query rows with no visible key are wrong: softmax over "
                   "no key must give 0 there, and every other row is right"),
    V.MASK_ALIGNMENT: ("puts the mask's diagonal at the wrong alignment", "the output matches the other alignment of "
                       "the causal / window diagonal (top-left vs bottom-right) within the bound"),
    V.MASK_IGNORED: ("ignores the mask", "the output matches attention with no causal mask or window at all: the "
                     "band was never applied"),
    V.WINDOW_OFF_BY_ONE: ("has its window off by one", "the output matches a window with one bound moved by one"),
    V.GQA_MAPPING: ("maps query heads to the wrong KV heads", "the output matches query head i reading KV head i % hk "
                    "instead of i // (h // hk)"),
    V.SCALE: ("uses the wrong softmax scale", "the output matches another softmax scale"),
    V.LSE: ("returns a wrong log-sum-exp", "the output is right; the log-sum-exp returned beside it is not"),
    V.GRADIENT: ("returns wrong gradients", "the forward output is right; a gradient (dQ, dK or dV) is not"),
    V.TOLERANCE: ("is wrong beyond rounding error", "the error exceeds what a correct kernel's rounding allows, and no "
                  "simple mistake (other alignment, window off by one, dropped mask, head mapping, scale) explains it"),
    V.NONDETERMINISTIC: ("is not bitwise reproducible", "two identical runs on the same inputs differ in some bits"),
    V.BATCH_VARIANT: ("is not batch invariant", "a sequence gets other bits alone (or in another batch order) than "
                      "inside its batch, though the backend claims it does not"),
}
LIBRARIES = {"flex-eager": ("torch", "torch flex_attention, eager"), "fa2": ("flash-attn 2", "flash-attn 2"),
             "flex-compiled": ("torch", "torch.compile(flex_attention)"), "fa3": ("flash-attn 3", "flash-attn 3"),
             "fa4": ("flash-attn-4", "flash-attn-4 (flash_attn.cute)")}
TE_ONLY = {"te-flash": "FlashAttention", "te-fused": "FusedAttention (cuDNN)",
           "te-unfused": "UnfusedDotProductAttention"}
AXES = {"out": "batch, query, head, channel", "dq": "batch, query, head, channel", "dk": "batch, key, KV head, channel",
        "dv": "batch, key, KV head, channel", "lse": "batch, head, query"}
SCRIPT_LIMIT = 60_000  # characters of script an issue body can carry; past it, long literal lines are elided


def add_parser(sub) -> None:
    p = sub.add_parser("report-bug", help="write an issue-ready markdown report of a corpus entry, its case rerun "
                       "through every backend that can run here")
    p.add_argument("entry", type=Path, help="a corpus entry (.json), with its repro script (.py) beside it")
    p.add_argument("--out", type=Path, help="write the report here (default: stdout)")
    options.add(p, "device", "isolate", "case-timeout", case_timeout={"default": 120.0},
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
                       known=corpus_io.known_bugs(args.entry.parent))
    text = render(entry, args.entry, device, moved, rows)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


# -- words -------------------------------------------------------------------------------------------------------

def library(name: str) -> tuple[str, str]:
    """(the library a backend needs, what the backend calls in it); ("", "") for a bring-your-own kernel."""
    if name.startswith("sdpa-"):
        return "torch", f"torch SDPA forced to its {name[5:]} kernel"
    if name in TE_ONLY:
        return "TransformerEngine", f"TransformerEngine DotProductAttention with only {TE_ONLY[name]} enabled"
    if name.startswith("te-cp-"):
        comm, _, kernel = name[6:].rpartition("-")
        return "TransformerEngine", f"TransformerEngine context parallelism, cp_comm_type {comm}, {kernel} attention"
    if name.startswith("ring-"):
        return "torch", f"torch context-parallel ring attention, {name[5:]} rotation"
    return LIBRARIES.get(name, ("", ""))


def what_went_wrong(verdict: V.Verdict) -> tuple[str, str]:
    """(a phrase for the title, the explanation) of a failure's label."""
    d = verdict.diagnosis or ""
    if verdict.status == V.FLAKY:
        status, _, inner = d.partition(":")
        phrase, why = what_went_wrong(V.Verdict(status, inner or None))
        return f"sometimes {phrase}", f"{why}; not every time: rerun on the same inputs, the case did not always fail"
    if verdict.status == V.FAIL and d in EXPLAIN:
        return EXPLAIN[d]
    if verdict.status == V.HANG:
        return "hangs", "no answer came back within the time limit, twice (the second time with twice the limit)"
    if verdict.status != V.CRASH:
        return verdict.label.lower(), verdict.message
    if d == V.CUDA_ILLEGAL_ADDRESS:
        return "hits an illegal memory access", ("the call raised CUDA error 700 (illegal address), which poisons the "
                                                 "CUDA context of the process that saw it")
    how = f" with {d}" if d.startswith("SIG") else f" with exit status {d[5:]}" if d.startswith("EXIT_") else ""
    if how or d == "PROCESS_DIED":
        return f"kills its process{how}", f"the process running the call died{how}"
    return f"raises {d}", f"the call raised {d} on a case the adapter lists as supported"


def features(case: Case) -> tuple[str, list[str]]:
    """(what attention it is, its other salient features), in plain words."""
    align = case.alignment.replace("_", "-")
    if case.mask_density is not None:
        kind = f"attention with an explicit boolean mask (keeping {case.mask_density:g} of keys)"
    elif case.right == 0 and case.left is None:
        kind = f"causal ({align}) attention"
    elif case.window != (None, None):
        kind = f"sliding-window attention (left {case.left}, right {case.right}, {align})"
    else:
        kind = "unmasked attention"
    rest = [f"padded sequences (query lengths {list(case.lens_q)}, key lengths {list(case.lens_kv)})"] * case.padded
    rest += {"thd": ["the packed thd layout"], "sbhd": ["the sequence-major sbhd layout"]}.get(case.layout, [])
    rest += {"transposed": ["head-major (transposed) q/k/v buffers"],
             "expanded_kv": ["stride-0 K/V (one KV head expanded)"]}.get(case.memory, [])
    rest += [f"GQA ({case.h} query heads over {case.hk} KV head{'s' * (case.hk > 1)})"] * (case.h != case.hk)
    rest += [f"d_qk {case.d_qk} != d_v {case.d_v}"] * (case.d_qk != case.d_v)
    rest += [f"softcap {case.softcap:g}"] if case.softcap is not None else []
    rest += ["ALiBi"] * (case.alibi_slopes is not None)
    rest += [f"{'an off-by-one' if case.softmax == 'off_by_one' else 'a learnable'} softmax sink"] * (
        case.softmax != "vanilla")
    rest += [f"scale {case.scale:g}"] if case.scale is not None else []
    rest += [f"inputs of mean {list(case.mean)} and std {list(case.std)} (large logits)"] * (
        case.mean != (0.0, 0.0, 0.0) or case.std != (1.0, 1.0, 1.0))
    return kind, rest + ["gradients"] * case.grads


def shape(case: Case) -> str:
    heads = f"h={case.h}" if case.h == case.hk else f"h={case.h} hk={case.hk}"
    dims = f"d={case.d_qk}" if case.d_qk == case.d_v else f"d_qk={case.d_qk} d_v={case.d_v}"
    lens = f"sq=skv={case.sq}" if case.sq == case.skv else f"sq={case.sq} skv={case.skv}"
    return f"{case.dtype}, b={case.b} {lens} {heads} {dims}"


def _num(x: float) -> str:
    return "inf" if x == math.inf else ("nan" if x != x else f"{x:.4g}")


def _join(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _table(header: list[str], rows: list[list[str]]) -> str:
    def cell(text) -> str:
        text = " ".join(str(text).split()).replace("|", "\\|")
        return text if len(text) <= 240 else text[:237] + "..."
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows])


def result(row: Row) -> str:
    v = row.verdict
    if row.outcome == V.PASS or (row.outcome == V.FAIL and v.ratio < math.inf):
        return f"{'PASS' if v.status == V.PASS else f'**{v.label}**'} ({_num(v.ratio)})"
    if row.outcome == V.FAIL:  # all-zero and non-finite outputs are failed without a ratio
        return f"**{v.label}**"
    return f"**{v.label}**: {row.detail}" if v is not None and v.failed else f"{row.outcome}: {row.detail}"


def now_sentence(entry: corpus_io.Entry, own: Row, device: str) -> str:
    """Whether the entry's failure came back here, in its own spelling."""
    saved, v = entry.verdict, own.verdict
    if v is None:
        return (f"{entry.backend} cannot run on this machine ({own.detail.rstrip('.')}), so the failure is not "
                f"confirmed here: the worst element below is the one recorded when it was found.")
    name = f"{entry.backend} {own.version}".strip()
    on = f" on {device} (it was found on {entry.device}: another kernel)" \
        if device.split(":")[0] != entry.device.split(":")[0] else ""
    if v.status == V.UNSUPPORTED:
        return f"Here{on} {name} refuses the case ({v.message}), so the failure is not confirmed here."
    if v.failed and v.label == saved_label(saved):
        return (f"Here{on}, {name} fails the case the same way ({v.label})." if on
                else f"It reproduces here: {name} fails the case again with {v.label}.")
    if v.failed:
        return f"It still fails here{on}, but now as {v.label} (recorded as {saved.label})."
    if saved.status == V.FLAKY:
        return (f"It did not fail in this one run here{on} ({name} passed); the entry is flaky, so a pass is no "
                f"evidence that it is fixed.")
    return (f"It no longer reproduces here{on}: {name} passes the case (error / bound {_num(v.ratio)}); compare the "
            f"environment it was found in, below.")


def others_sentence(entry: corpus_io.Entry, rows: list[Row]) -> str:
    ran = [r for r in rows if r.verdict is not None and r.verdict.status != V.UNSUPPORTED]
    label = saved_label(entry.verdict)
    passed = list(dict.fromkeys(r.backend for r in ran if not r.own and r.verdict.status == V.PASS))
    same = list(dict.fromkeys(r.backend for r in ran if not r.own and r.verdict.label == label))
    other = list(dict.fromkeys(f"{r.backend} ({r.verdict.label}{', ' + r.note if r.note else ''})" for r in ran
                               if not r.own and r.verdict.failed and r.verdict.label != label))
    refused = list(dict.fromkeys(r.backend for r in rows if not r.own and r.outcome == V.UNSUPPORTED))
    if passed:
        parts = [f"On the same case here, {_join(passed)} {'pass' if len(passed) > 1 else 'passes'} against the "
                 f"float64 oracle."]
    elif refused and not any(not r.own for r in ran):
        parts = [f"No other backend that can run here takes the case: {_join(refused)} refuse"
                 f"{'s' * (len(refused) == 1)} it (the table says why)."]
    else:
        parts = ["No other backend passes the case here."]
    parts += [f"{_join(same)} {'fail' if len(same) > 1 else 'fails'} the same way ({label})."] if same else []
    parts += [f"Failing differently: {_join(other)}."] if other else []
    mine_pass = [r.spelling for r in ran if r.own and r.verdict.status == V.PASS]
    mine_fail = [r.spelling for r in ran if r.own and r.verdict.failed]
    if mine_pass and mine_fail:
        parts.append(f"Of {entry.backend}'s spellings, {_join(mine_fail)} fail{'s' * (len(mine_fail) == 1)} and "
                     f"{_join(mine_pass)} pass{'es' * (len(mine_pass) == 1)}.")
    return " ".join(parts)


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
        from attnfuzz.store.repro import get_family
        from attnfuzz.strategies.materialize import draw_on_cpu
        o, family = Oracle.of(entry.case, draw_on_cpu(entry.case)), get_family(entry)
        bound = (check_out(o, o.ref.out, o.ref.out, family) if w.tensor == "out"
                 else gradient_check(o, w.tensor, getattr(o.ref, w.tensor), family)).bound
        ratio = error / bound if bound > 0 and math.isfinite(error) else math.inf
    return [where, w.tensor, f"{list(w.index)} ({AXES.get(w.tensor, '')})", _num(w.got), _num(w.expected),
            _num(error), "-" if bound != bound else _num(bound), _num(ratio)]


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
            ["spelling", repr(case.spelling) + ("" if case.spelling else " (the adapter's default)")]]
    return _table(["", "case"], rows)


def cross_table(rows: list[Row], device: str, moved: str) -> list[str]:
    intro = (f"The same case (same seed: the same inputs) run now on {device} through the entry's backend in every "
             f"spelling it takes, and through every other registered backend, each graded against the float64 "
             f"oracle. A spelling is how the call expresses the case in that backend's API. {moved}")
    body = [[f"**{r.backend}**" if r.own else r.backend, r.spelling, r.version or "-", result(r), r.note] for r in rows]
    return ["## Other backends and spellings on the same case", "", intro.strip(), "",
            _table(["backend", "spelling", "version", "result (error / bound)", "note"], body)]


def repro_section(entry: corpus_io.Entry, path: Path) -> list[str]:
    script_path = path.with_suffix(".py")
    if script_path.exists():
        text, where = script_path.read_text(), f"`{script_path.name}` (beside the entry)"
    else:
        from attnfuzz.store.repro import script
        text, where = script(entry), f"`{script_path.name}` (not beside the entry: written now)"
    lib = library(entry.backend)[0]
    needs = "torch" + ("" if lib in ("", "torch") else f" and {lib}")
    if "from attnfuzz" in text:
        needs += ", and attnfuzz importable (it calls the adapter or regenerates large inputs from the seed)"
    lines = ["## Repro", "", f"{where} needs only {needs}, and "
             + ("a CUDA device" if entry.device.startswith("cuda") else "the CPU") + f" (`DEVICE = {entry.device!r}`). "
             "It carries the inputs and the float64 answers inline and checks the output"
             + (" and dQ / dK / dV" if entry.case.grads else "") + " against them:", "", "```bash",
             f"python3 {script_path.name}; echo \"exit status $?\"", "```", "",
             "Exit status 0: within the bound, the bug is not there. 1: the bug is there; it prints the error against "
             "the bound and what failed (non-finite output, all-zero output, error over the bound). An exception "
             "inside the library also exits 1, with its traceback; a process killed by a signal shows as 128 + the "
             "signal (139 for SIGSEGV)."]
    if entry.verdict.diagnosis in (V.LSE, f"{V.FAIL}:{V.LSE}"):
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
               f"{' with ' + _join(rest) if rest else ''}, in {shape(entry.case)}. {why[0].upper()}{why[1:]}. Found by "
               f"attnfuzz on {found_on} with torch {rec.get('torch', '(version not recorded)')}"
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
    return "\n".join(parts)
