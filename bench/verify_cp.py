"""Replay the context-parallel findings of the first 2x H200 run with the variations that tell an adapter bug from a
backend bug; one line per run. Once, on the 2-GPU runner (after `source /tmp/attn-stack/env.sh`), under 4 minutes:

    python3 bench/verify_cp.py [--corpus .gpu-findings/cp/corpus] [--budget-s 180] [--jsonl verify_cp.jsonl]

Every run is graded against the float64 oracle (attnfuzz.oracles.grade). Beside the grade, a line shows the CP-vs-non-CP
agreement of the same backend (all TE's own CP suite checks) and the oracle's grade of that non-CP run, so item 2
prints the seed story's table. Where the triage names a mechanism, the output is also compared with a model of it
(`model=`): a defect reproduced to rounding is a mechanism confirmed. Each line ends with whether it came out as the
triage predicted. Runs go in order of importance; past --budget-s the rest are listed as skipped.

  c  the corpus entries as saved (.gpu-findings/cp/corpus; each file is checked against the case built in here)
  1  ring fp32: torch's ring merge keeps the CUDA memory-efficient op's LSE, padded to 32 rows (torch defect)
  2  TE + FA4, causal: TE hands FA4 window (-1, 0), an empty band since flash-attention#2490 (backend defect)
  3  TE p2p + FusedAttention + thd: a KV step with no valid token returns LSE 0 and is merged in (backend defect)
  4  TE all_gather + FusedAttention, non-causal window: the per-step window is aligned top-left (backend defect)
  5  refusals the capability table declares, with TE's own reason (the table bypassed), and its new acceptances
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from attnfuzz.backends import get  # noqa: E402
from attnfuzz.backends.base import Hang, Unsupported  # noqa: E402
from attnfuzz.backends.cp.adapter import BACKENDS as CP_BACKENDS, CPBackend, cudnn_version  # noqa: E402
from attnfuzz.backends.cp.agreement import cp_vs_nocp  # noqa: E402
from attnfuzz.backends.cp.capabilities import CUDNN_THD_SINKS, RING_LSE_PADDING  # noqa: E402
from attnfuzz.backends.cp.pool import CPPool  # noqa: E402
from attnfuzz.backends.cp.te import TEEngine  # noqa: E402
from attnfuzz.oracles import verdict as V  # noqa: E402
from attnfuzz.oracles.grade import Oracle, grade  # noqa: E402
from attnfuzz.oracles.reference import reference  # noqa: E402
from attnfuzz.strategies.case import Case  # noqa: E402
from attnfuzz.strategies.materialize import Tensors, materialize  # noqa: E402

CP = 2
BF16 = dict(d_qk=64, d_v=64, dtype="bfloat16")


@dataclass(frozen=True)
class Run:
    """One run and what the triage predicts of it: the verdict label's prefix, the CP-vs-non-CP agreement, the
    non-CP run's label prefix, a defect model the output should match, a text the verdict message should hold.
    `table=False` sends TE the case even where the capability table refuses it."""

    item: str
    what: str
    backend: str
    case: Case
    expect: str
    agree: bool | None = None
    nocp: str | None = None
    model: str | None = None
    says: str = ""
    table: bool = True


# -- models of the defects the triage names (tests/test_cp_verify.py checks them against the first run's numbers) --

def all_gather_window_mask(case: Case, cp: int, alignment: str) -> torch.Tensor:
    """[b, 1, sq, skv] keys each query sees under TE 2.20.2's all_gather with a non-causal window (bshd/sbhd, DualChunk
    swap, sq == skv): chunk c of 2*cp gets the KV slice and the window get_kv_seq_info_after_all_gather computes,
    applied with `alignment`. bottom_right is what that computation assumes (and equals the case's band);
    top_left is what fused_attn_fwd does without bottom_right_diagonal for a no_mask / padding mask type."""
    s, (left, right) = case.sq, case.window
    n = s // (2 * cp)
    seen = torch.zeros(s, s, dtype=torch.bool)
    for c in range(2 * cp):
        end = (c + 1) * n
        kv_end = min(2 * cp * n, end + right)
        kv_start = max(0, end - n - left)
        w_left, w_right = left + kv_end - end, end + right - kv_end
        off = (kv_end - kv_start) - n if alignment == "bottom_right" else 0
        for i in range(n):
            lo, hi = max(kv_start, kv_start + i + off - w_left), min(kv_end - 1, kv_start + i + off + w_right)
            if lo <= hi:
                seen[c * n + i, lo:hi + 1] = True
    return seen.expand(case.b, 1, s, s)


def empty_step_output(case: Case, ref_out: torch.Tensor, ref_lse: torch.Tensor, cp: int) -> torch.Tensor:
    """The output of TE's p2p merge (non-causal, thd) when a step whose KV holds no valid token of a sequence returns
    LSE 0 and output 0: out_true * exp(lse) / (exp(lse) + 1). Under cp = 2 that step exists for the valid rows of
    each sequence no longer than one chunk (length 1: the other chunks are all padding)."""
    out = ref_out.clone()
    for n, length in enumerate(case.lens_q):
        chunk = math.ceil(length / (2 * cp))
        if 0 < length <= chunk:
            out[n, :length] = out[n, :length] * torch.sigmoid(ref_lse[n, :, :length]).transpose(0, 1)[..., None]
    return out


def model_output(run: Run, tensors: Tensors, oracle: Oracle) -> torch.Tensor:
    if run.model == "topleft":
        mask = all_gather_window_mask(run.case, CP, "top_left").to(tensors.q.device)
        plain = run.case.replace(window=(None, None))
        return reference(plain, dataclasses.replace(tensors, mask=mask), device=oracle.ref.out.device).out
    if run.model == "empty_step":
        return empty_step_output(run.case, oracle.ref.out, oracle.ref.lse, CP)
    raise ValueError(f"model={run.model!r}: known models are topleft, empty_step")


# -- the runs, most important first ---------------------------------------------------------------------------------

RING_CORPUS = Case(sq=2, skv=2)                                               # float32, d 16
AG_FLASH = Case(sq=4, skv=4, causal=True, **BF16)                             # all_gather-flash, p2p-flash
A2A_FLASH = Case(sq=4, skv=4, h=2, hk=2, causal=True, **BF16)
AG_FUSED = Case(sq=8, skv=8, window=(0, 1), **BF16)
P2P_FUSED = Case(sq=4, skv=4, seqlens_q=(1,), seqlens_kv=(1,), layout="thd", **BF16)
CORPUS = {"ring-allgather": RING_CORPUS, "ring-alltoall": RING_CORPUS, "te-cp-a2a-flash": A2A_FLASH,
          "te-cp-all_gather-flash": AG_FLASH, "te-cp-p2p-flash": AG_FLASH, "te-cp-p2p-fused": P2P_FUSED,
          "te-cp-all_gather-fused": AG_FUSED}
ZERO = "FAIL:ALL_ZERO"


def runs(cudnn: int | None) -> list[Run]:
    long_causal = Case(sq=256, skv=256, h=2, hk=2, causal=True, seed=1, **BF16)
    thd = dict(layout="thd", **BF16)
    out = [
        Run("c", "corpus fp32 sq=2 (1 row per rank)", "ring-allgather", RING_CORPUS, "CRASH", says=RING_LSE_PADDING),
        Run("c", "corpus fp32 sq=2 (1 row per rank)", "ring-alltoall", RING_CORPUS, "CRASH", says=RING_LSE_PADDING),
        Run("c", "corpus causal sq=4 h=2", "te-cp-a2a-flash", A2A_FLASH, ZERO, True, ZERO),
        Run("c", "corpus causal sq=4", "te-cp-all_gather-flash", AG_FLASH, ZERO, True, ZERO),
        Run("c", "corpus causal sq=4", "te-cp-p2p-flash", AG_FLASH, "FAIL", False, ZERO),
        Run("c", "corpus thd seqlens (1,)", "te-cp-p2p-fused", P2P_FUSED, "FAIL", False, "PASS", "empty_step"),
        Run("c", "corpus window (0, 1) sq=8", "te-cp-all_gather-fused", AG_FUSED, "FAIL", False, "PASS", "topleft"),
    ]
    seed = Case(sq=8, skv=8, h=2, hk=2, causal=True, seed=8, **BF16)  # all_gather-fused takes no sq=4 (item 5)
    for comm in ("p2p", "all_gather", "a2a"):   # the seed story's table: FA4 on, FA4 off (FusedAttention)
        out.append(Run("2", "causal sq=8 h=2, FA4", f"te-cp-{comm}-flash", seed, "FAIL", comm != "p2p", ZERO))
        out.append(Run("2", "causal sq=8 h=2, FA4 off", f"te-cp-{comm}-fused", seed, "PASS", True, "PASS"))
    out += [
        Run("2", "FA4 alone, causal=True window (None, None)", "fa4", seed, "PASS"),
        Run("2", "FA4 alone, causal=True window (-1, 0) = TE", "fa4", seed.replace(spelling="causal+neg"), ZERO),
        Run("2", "non-causal sq=8 h=2, FA4", "te-cp-p2p-flash", seed.replace(causal=False), "PASS", True, "PASS"),
        Run("4", "window (0, 1) sq=8, FA4", "te-cp-all_gather-flash", AG_FUSED, "PASS", True, "PASS"),
        Run("4", "window (0, 1) sq=8 h=2", "te-cp-a2a-fused", AG_FUSED.replace(h=2, hk=2), "PASS", True, "PASS"),
        Run("4", "window (3, 3) sq=16 h=2", "te-cp-all_gather-fused",
            Case(sq=16, skv=16, h=2, hk=2, window=(3, 3), seed=2, **BF16), "FAIL", False, "PASS", "topleft"),
        Run("4", "causal window (3, None) sq=16 h=2", "te-cp-all_gather-fused",
            Case(sq=16, skv=16, h=2, hk=2, causal=True, window=(3, None), seed=3, **BF16), "PASS", True, "PASS"),
        Run("4", "first run's thd window (8, 12) seqlens (2,)", "te-cp-all_gather-fused",
            Case(sq=4, skv=4, d_qk=128, d_v=128, dtype="float16", seqlens_q=(2,), seqlens_kv=(2,), window=(8, 12),
                 scale=0.19957439129207416, layout="thd", seed=300, grads=True), "FAIL", False, "PASS"),
        Run("3", "thd seqlens (2,)", "te-cp-p2p-fused", P2P_FUSED.replace(seqlens_q=(2,), seqlens_kv=(2,)), "PASS",
            True, "PASS"),
        Run("3", "thd seqlens (3,)", "te-cp-p2p-fused", P2P_FUSED.replace(seqlens_q=(3,), seqlens_kv=(3,)), "PASS",
            True, "PASS"),
        Run("3", "thd b=2 seqlens (1, 7) sq=8", "te-cp-p2p-fused",
            Case(b=2, sq=8, skv=8, seqlens_q=(1, 7), seqlens_kv=(1, 7), seed=4, **thd), "FAIL", False, "PASS",
            "empty_step"),
        Run("3", "thd seqlens (1,) causal", "te-cp-p2p-fused", P2P_FUSED.replace(causal=True), "PASS", True, "PASS"),
        Run("3", "thd seqlens (1,) h=2", "te-cp-a2a-fused", P2P_FUSED.replace(h=2, hk=2), "PASS", True, "PASS"),
        Run("3", "thd seqlens (1,)", "te-cp-all_gather-fused", P2P_FUSED, "PASS", True, "PASS"),
        Run("1", "fp32 sq=4 (2 rows per rank)", "ring-allgather", Case(sq=4, skv=4), "CRASH", says="must match"),
        Run("1", "fp32 sq=64 causal, balanced (16-row halves)", "ring-allgather", Case(sq=64, skv=64, causal=True),
            "CRASH", says=RING_LSE_PADDING),
        Run("1", "fp32 sq=64 (32 rows per rank) grads", "ring-allgather", Case(sq=64, skv=64, h=2, grads=True), "PASS",
            True),
        Run("1", "fp32 sq=128 causal balanced grads", "ring-alltoall",
            Case(sq=128, skv=128, h=2, causal=True, grads=True, seed=5), "PASS", True),
        Run("1", "bf16 sq=2 (flash op: unpadded LSE)", "ring-allgather", RING_CORPUS.replace(dtype="bfloat16"), "PASS"),
        Run("5", "table off: bshd sq=skv=4 (1-row chunks)", "te-cp-all_gather-fused", Case(sq=4, skv=4, **BF16),
            "UNSUPPORTED", table=False),
        Run("5", "table off: thd learnable softmax h=2", "te-cp-a2a-fused",
            Case(sq=8, skv=8, h=2, hk=2, softmax="learnable", seqlens_q=(8,), seqlens_kv=(8,), seed=6, **thd),
            "PASS" if (cudnn or 0) >= CUDNN_THD_SINKS else "UNSUPPORTED", table=False),
        Run("5", "bshd sq=4 skv=8 (accepted by the table)", "te-cp-all_gather-fused", Case(sq=4, skv=8, **BF16),
            "PASS", True, "PASS"),
        Run("5", "thd seqlens (3,): FA4 with padding (newly drawn)", "te-cp-p2p-flash",
            P2P_FUSED.replace(seqlens_q=(3,), seqlens_kv=(3,)), "PASS", True, "PASS"),
    ]
    for comm in ("p2p", "all_gather", "a2a"):   # the same at a realistic size: a 64-row chunk per step
        out.append(Run("2", "causal sq=256 h=2, FA4", f"te-cp-{comm}-flash", long_causal, "FAIL", comm != "p2p",
                       ZERO))
        out.append(Run("2", "causal sq=256 h=2, FA4 off", f"te-cp-{comm}-fused", long_causal, "PASS", True, "PASS"))
    out.append(Run("4", "window (16, 16) sq=256 h=2", "te-cp-all_gather-fused",
                   Case(sq=256, skv=256, h=2, hk=2, window=(16, 16), seed=7, **BF16), "FAIL", False, "PASS",
                   "topleft"))
    return out


# -- running and reporting ---------------------------------------------------------------------------------------

class Runner:
    """Backends by name, CP ones sharing one worker pool per world size (kernels compiled once serve them all)."""

    def __init__(self, device: str, timeout_s: float):
        self.device, self.timeout_s, self.pools = device, timeout_s, {}

    def backend(self, run: Run):
        if run.backend not in CP_BACKENDS:
            return get(run.backend, self.device)
        engine = CP_BACKENDS[run.backend](self.device).engine
        if isinstance(engine, TEEngine) and not run.table:
            engine = dataclasses.replace(engine, table=False)
        if engine.world not in self.pools:
            self.pools[engine.world] = CPPool(engine.world, device=self.device, timeout_s=self.timeout_s)
        return CPBackend(engine, self.device, pool=self.pools[engine.world])

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()


def attempt(backend, case: Case, tensors: Tensors):
    """(verdict, output): a refusal, a crash or a hang as the harness records them, else the output to grade."""
    reason = backend.unsupported(case)
    if reason is not None:
        return V.Verdict(V.UNSUPPORTED, None, reason), None
    try:
        return None, backend.run(case, tensors)
    except Unsupported as e:
        return V.Verdict(V.UNSUPPORTED, None, str(e)), None
    except Hang as e:
        return V.Verdict(V.HANG, type(e).__name__, str(e)), None
    except Exception as e:  # noqa: BLE001 - every failure becomes a line
        return V.Verdict(V.CRASH, type(e).__name__, f"{type(e).__name__}: {str(e)[:600]}"), None


def execute(runner: Runner, run: Run) -> dict:
    start = time.perf_counter()
    row = {"item": run.item, "what": run.what, "backend": run.backend, "case": run.case.to_dict()}
    backend = runner.backend(run)
    why = backend.available()
    if why is not None:
        return {**row, "label": "UNAVAILABLE", "message": why, "predicted": False, "expect": run.expect}
    tensors = materialize(run.case, runner.device)
    verdict, output = attempt(backend, run.case, tensors)
    agreement, nocp, model = None, None, None
    if output is not None:
        oracle = Oracle.of(run.case, tensors, device=runner.device)
        verdict = grade(run.case, tensors, output, family=backend.family, oracle=oracle)
        agreement = getattr(backend, "last_agreement", None)
        whole = getattr(backend, "last_nocp", None)
        if whole is not None:  # graded on what the non-CP run gives (torch's has no gradients)
            graded = run.case if whole.dq is not None else run.case.replace(grads=False)
            nocp = grade(graded, tensors, whole, family=backend.family, oracle=oracle)
        if run.model:
            model = cp_vs_nocp(run.case, output, V.Output(out=model_output(run, tensors, oracle)))
        row["ran"] = output.ran
    checks = {"label": verdict.label.startswith(run.expect), "says": run.says in verdict.message,
              "agree": run.agree is None or (agreement is not None and agreement.agree == run.agree),
              "nocp": run.nocp is None or (nocp is not None and nocp.label.startswith(run.nocp)),
              "model": run.model is None or (model is not None and model.agree)}
    return {**row, "label": verdict.label, "ratio": verdict.ratio, "message": verdict.message,
            "agree": None if agreement is None else [agreement.agree, agreement.max_abs_diff],
            "nocp": None if nocp is None else nocp.label,
            "model": None if model is None else [run.model, model.agree, model.max_abs_diff],
            "predicted": all(checks.values()), "missed": [k for k, ok in checks.items() if not ok],
            "expect": run.expect, "seconds": round(time.perf_counter() - start, 2)}


def line(row: dict) -> str:
    ratio = row.get("ratio")
    ratio = "" if ratio is None else ("inf" if ratio == math.inf else f"{ratio:.3g}")
    agree = row.get("agree")
    agree = "-" if agree is None else f"{'agree' if agree[0] else 'DISAGREE'}({agree[1]:.2g})"
    model = row.get("model")
    model = "" if model is None else f" model={model[0]}:{'match' if model[1] else 'NO'}({model[2]:.2g})"
    verdict = "as predicted" if row.get("predicted") else f"UNEXPECTED (wanted {row.get('expect')}; " \
                                                          f"missed {','.join(row.get('missed', [])) or '-'})"
    head = row.get("message", "").replace("\n", " | ")[:220]
    ran = f" ran: {row['ran'][:120]}" if row.get("ran") and row["label"] != "PASS" else ""
    return (f"{row['item']} {row['backend']:<23} {row['what']:<46} {row['label']:<19} ratio={ratio:<7} "
            f"cp~nocp={agree:<16} nocp={row.get('nocp') or '-':<14}{model} [{row.get('seconds', 0):.1f}s] "
            f"{verdict}{(' | ' + head) if head and row['label'] != 'PASS' else ''}{ran}")


def efficient_lse_rows(device: str) -> str:
    """The LSE rows CUDA's memory-efficient SDPA op returns for 1, 2, 32 and 33 query rows (item 1's root cause)."""
    rows = []
    for s in (1, 2, 32, 33):
        q = torch.randn(1, 1, s, 16, device=device)
        rows.append(torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, True)[1].shape[-1])
    verdict = "as predicted" if rows == [32, 32, 32, 64] else "UNEXPECTED (wanted [32, 32, 32, 64])"
    return f"1 aten efficient op: LSE rows for 1, 2, 32, 33 query rows = {rows} {verdict}"


def check_corpus(directory: Path) -> list[str]:
    """One note per corpus file: whether its case is the one built in here."""
    from attnfuzz.store.corpus import load, entry_paths

    if not directory.is_dir():
        return [f"c corpus {directory}: not found; the built-in copies of its cases run instead"]
    notes = []
    for path in entry_paths(directory):
        entry = load(path)
        same = CORPUS.get(entry.backend) == entry.case
        what = "same case as built in" if same else f"DIFFERENT case: {entry.case!r}"
        notes.append(f"c corpus {path.name}: {what}")
    return notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path(".gpu-findings/cp/corpus"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=180.0, help="start no run after this many seconds")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="a CP run silent this long is a HANG")
    parser.add_argument("--only", default="", help="comma-separated items to run (c,1,2,3,4,5); default all")
    parser.add_argument("--jsonl", type=Path, help="also write one JSON row per run here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    cudnn = cudnn_version(args.device)
    versions = ", ".join(f"{n}: {get(n, args.device).version() or '?'}" for n in ("te-cp-p2p-fused", "fa4"))
    print(f"torch {torch.__version__}, cuDNN {cudnn}, GPUs {torch.cuda.device_count()}; {versions}")
    for note in check_corpus(args.corpus):
        print(note)
    only = {x for x in args.only.split(",") if x}
    plan = [r for r in runs(cudnn) if not only or r.item in only]
    if not only or "1" in only:
        try:
            print(efficient_lse_rows(args.device), flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"1 aten efficient op: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    runner, rows = Runner(args.device, args.timeout_s), []
    try:
        for run in plan:
            if time.perf_counter() - start > args.budget_s:
                rows.append({"item": run.item, "what": run.what, "backend": run.backend, "label": "SKIPPED",
                             "message": f"past --budget-s={args.budget_s:g}", "predicted": False})
            else:
                try:
                    rows.append(execute(runner, run))
                except Exception as e:  # noqa: BLE001 - the script itself must reach the summary
                    rows.append({"item": run.item, "what": run.what, "backend": run.backend, "label": "ERROR",
                                 "message": f"{type(e).__name__}: {e}", "predicted": False})
            print(line(rows[-1]), flush=True)
    finally:
        runner.close()
    done = [r for r in rows if r["label"] != "SKIPPED"]
    print(f"{len(done)} runs in {time.perf_counter() - start:.0f}s: {sum(r['predicted'] for r in done)} as predicted, "
          f"{sum(not r['predicted'] for r in done)} not; {len(rows) - len(done)} skipped")
    if args.jsonl:
        args.jsonl.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
