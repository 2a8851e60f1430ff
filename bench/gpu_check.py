"""GPU check of the flash-attn (fa2 / fa3 / fa4) and TransformerEngine (te-flash / te-fused / te-unfused) adapters:
a fixed list of cases covering their features and spellings, each run and graded against the float64 oracle.

    python3 bench/gpu_check.py --out DIR [--backends fa4,te-flash] [--per-backend-s 110]

Each backend runs in its own child process, so a CUDA fault or a hang in one cannot stop the others; a child past
its time budget skips its remaining cases, and one that stops answering is killed and recorded as HANG. Prints one
line per case (backend, verdict label, ratio, what ran, case) and a summary table; writes DIR/<backend>.jsonl and
DIR/summary.txt. Never stops at the first exception: every exception is recorded (CRASH) and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnfuzz.strategies.case import Case  # noqa: E402

BACKENDS = ("fa2", "fa3", "fa4", "te-flash", "te-fused", "te-unfused")
TORCH_BACKENDS = ("sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex-eager", "flex-compiled")  # on request
GRACE_S = 90   # beyond a child's own budget (first CUDA init, imports, the last case) before it counts as hung


def fixed_cases() -> list[tuple[str, Case, bool]]:
    """(label, case, run every spelling) in priority order: the seed-003 shape first."""
    bf, h4 = dict(dtype="bfloat16", h=4, d_qk=64, d_v=64), dict(h=4, d_qk=64, d_v=64)
    br = dict(alignment="bottom_right")
    return [
        ("causal-self-1k", Case(b=2, sq=1024, skv=1024, h=8, d_qk=128, d_v=128, dtype="bfloat16", causal=True), True),
        ("full-self", Case(b=2, sq=256, skv=256, **bf), True),
        ("causal-cross-br", Case(sq=128, skv=384, causal=True, dtype="float16", grads=True, **h4, **br), True),
        ("causal-topleft-sq>skv", Case(sq=192, skv=64, causal=True, **bf), False),
        ("sliding-causal", Case(sq=512, skv=512, causal=True, window=(128, None), grads=True, **bf, **br), True),
        ("band", Case(sq=256, skv=320, window=(32, 16), **bf, **br), True),
        ("band-left-unbounded", Case(sq=256, skv=256, window=(None, 8), **bf, **br), True),
        ("gqa-grads", Case(sq=256, skv=256, h=8, hk=2, d_qk=128, d_v=128, dtype="bfloat16", causal=True,
                           grads=True, **br), False),
        ("mqa-expanded-kv", Case(sq=128, skv=128, hk=4, memory="expanded_kv", causal=True, **bf, **br), False),
        ("d96-fp16-grads", Case(sq=200, skv=300, h=4, d_qk=96, d_v=96, dtype="float16", grads=True), False),
        ("dqk192-dv128", Case(sq=256, skv=256, h=4, d_qk=192, d_v=128, dtype="bfloat16", causal=True, **br), False),
        ("softcap", Case(sq=256, skv=256, softcap=30.0, causal=True, grads=True, **bf, **br), False),
        ("alibi", Case(sq=256, skv=256, causal=True, alibi_slopes=(0.5, 0.25, 0.125, 0.0625), **bf, **br), False),
        ("off-by-one", Case(sq=256, skv=256, softmax="off_by_one", causal=True, **bf, **br), False),
        ("learnable-sink", Case(sq=128, skv=256, softmax="learnable", grads=True, **bf), False),
        ("thd-self", Case(b=3, sq=256, skv=256, seqlens_q=(37, 256, 1), seqlens_kv=(37, 256, 1), layout="thd",
                          causal=True, grads=True, **bf, **br), True),
        ("thd-cross-empty", Case(b=3, sq=64, skv=64, seqlens_q=(20, 64, 5), seqlens_kv=(50, 64, 0), layout="thd",
                                 causal=True, **bf, **br), False),
        ("padded-bshd", Case(b=2, sq=192, skv=192, seqlens_q=(192, 77), seqlens_kv=(100, 192), causal=True,
                             **bf, **br), True),
        ("sbhd-grads", Case(sq=256, skv=256, layout="sbhd", causal=True, grads=True, **bf, **br), False),
        ("transposed", Case(sq=256, skv=256, memory="transposed", **bf), False),
        ("custom-scale", Case(sq=128, skv=128, scale=0.05, dtype="float16", **h4), False),
        ("decode", Case(sq=1, skv=777, causal=True, **bf, **br), False),
        ("empty-rows", Case(sq=300, skv=100, causal=True, **bf, **br), False),
        ("explicit-mask", Case(sq=64, skv=96, mask_density=0.7, dtype="float16", **h4), False),
        ("fp32", Case(sq=128, skv=128, causal=True, dtype="float32", **h4), False),
    ]


def run_one(backend, case: Case, device: str = "cuda") -> dict:
    """One case through one backend: UNSUPPORTED, CRASH (with the exception), or the graded verdict."""
    import torch

    from attnfuzz.backends.base import Unsupported
    from attnfuzz.oracles.grade import Oracle, grade
    from attnfuzz.strategies.materialize import materialize

    row = {"backend": backend.name, "case": case.to_dict(), "label": "", "ratio": None, "ran": "", "message": ""}
    start = time.perf_counter()
    reason = backend.unsupported(case)
    if reason is not None:
        row.update(label="UNSUPPORTED", message=reason)
        return row
    try:
        tensors = materialize(case, device)
        output = backend.run(case, tensors)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        row["ran"] = output.ran
        verdict = grade(case, tensors, output, family=backend.family,
                        oracle=Oracle.of(case, tensors, device=device, family=backend.family))
        row.update(label=verdict.label, ratio=verdict.ratio, message=verdict.message)
    except Unsupported as e:
        row.update(label="UNSUPPORTED", message=str(e))
    except Exception as e:  # recorded, never raised: the run goes on
        where = traceback.extract_tb(e.__traceback__)[-1]
        row.update(label=f"CRASH:{type(e).__name__}",
                   message=f"{str(e)[:400]} (at {Path(where.filename).name}:{where.lineno})")
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def line(row: dict) -> str:
    ratio = "" if row.get("ratio") is None else f"ratio={row['ratio']:.3g}"
    case = Case.from_dict(row["case"]) if "case" in row else ""
    note = row["message"][:160] if not row["label"].startswith("PASS") else ""
    return f"{row['backend']:<10} {row['label']:<26} {ratio:<13} ran={row['ran'] or '-'} {case!r} {note}"


def child(name: str, out: Path, budget_s: float, device: str = "cuda") -> None:
    """Run every fixed case (and its spellings) through one backend, appending rows to out/<name>.jsonl."""
    from attnfuzz.backends import get

    backend = get(name, device)
    rows_path = out / f"{name}.jsonl"
    start = time.perf_counter()

    def emit(row: dict) -> None:
        with rows_path.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(line(row) if "case" in row else f"{name:<10} {row['label']:<26} {row['message']}", flush=True)

    why = backend.available() if device.startswith("cuda") else None
    if why:
        emit({"backend": name, "label": "UNAVAILABLE", "message": why, "ran": ""})
        return
    emit({"backend": name, "label": "VERSION", "message": backend.version(), "ran": ""})
    for label, case, every_spelling in fixed_cases():
        spellings = backend.spellings(case) if every_spelling and backend.unsupported(case) is None else ("",)
        for spelling in spellings:
            spelled = case.replace(spelling=spelling)
            if time.perf_counter() - start > budget_s:
                emit({"backend": name, "case": spelled.to_dict(), "label": "SKIPPED",
                      "message": f"over the {budget_s:.0f} s budget", "ran": ""})
                continue
            (out / f"{name}.inflight").write_text(json.dumps({"name": label, "case": spelled.to_dict()}))
            row = run_one(backend, spelled, device)
            row["name"] = label
            emit(row)
    (out / f"{name}.inflight").unlink(missing_ok=True)


def summarize(out: Path, names: list[str]) -> str:
    """A table of verdict labels per backend, then every line that is neither PASS nor UNSUPPORTED."""
    counts, notable = {}, []
    for name in names:
        path = out / f"{name}.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        counts[name] = Counter(r["label"] for r in rows if r["label"] != "VERSION")
        notable += [r for r in rows if r["label"] not in ("PASS", "UNSUPPORTED", "VERSION")]
    labels = sorted({label for c in counts.values() for label in c})
    width = max([10] + [len(x) for x in labels])
    text = [f"{'backend':<10} " + " ".join(f"{x:>{width}}" for x in labels)]
    text += [f"{name:<10} " + " ".join(f"{counts[name].get(x, 0):>{width}}" for x in labels) for name in names]
    text += ["", "not PASS / UNSUPPORTED:"] + [line(r) if "case" in r else f"{r['backend']:<10} {r['label']} "
                                                f"{r['message']}" for r in notable]
    return "\n".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for <backend>.jsonl and summary.txt")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, from {BACKENDS}")
    parser.add_argument("--per-backend-s", type=float, default=110.0, help="time budget of each backend's cases")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = [n for n in args.backends.split(",") if n]
    unknown = [n for n in names if n not in BACKENDS + TORCH_BACKENDS]
    if unknown:
        parser.error(f"--backends: unknown {unknown}; known: {','.join(BACKENDS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args.child, args.out, args.per_backend_s)
        return
    for name in names:
        (args.out / f"{name}.jsonl").unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "--child", name, "--out", str(args.out),
               "--per-backend-s", str(args.per_backend_s)]
        try:
            done = subprocess.run(cmd, timeout=args.per_backend_s + GRACE_S)
            if done.returncode != 0:
                record(args.out, name, f"CRASH:exit{done.returncode}", "the child process died")
        except subprocess.TimeoutExpired:
            record(args.out, name, "HANG", f"no end after {args.per_backend_s + GRACE_S:.0f} s")
    summary = summarize(args.out, names)
    (args.out / "summary.txt").write_text(summary + "\n")
    print("\n" + summary)


def record(out: Path, name: str, label: str, why: str) -> None:
    """A row for a child that died or hung, naming the case it was running."""
    inflight = out / f"{name}.inflight"
    row = {"backend": name, "label": label, "message": why, "ran": ""}
    if inflight.exists():
        row.update(json.loads(inflight.read_text()))
        inflight.unlink()
    with (out / f"{name}.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
