"""Bring-your-own kernels that misbehave for real: the crash-isolation tests run them in worker processes."""

import ctypes
import os
import time
from pathlib import Path

import torch


def _plain(q, k, v, scale, causal=False, bottom_right=False):
    """Attention without windows, padding or masks other than causal (the only cases these kernels take)."""
    k, v = (x.repeat_interleave(q.shape[2] // x.shape[2], dim=2) for x in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    if causal:
        sq, skv = q.shape[1], k.shape[1]
        shift = skv - sq if bottom_right else 0
        hidden = torch.arange(skv)[None, :] > torch.arange(sq)[:, None] + shift
        scores = scores.masked_fill(hidden.to(scores.device), float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row that sees no key gives 0
    return torch.einsum("bhqk,bkhd->bqhd", weights, v.float()).to(q.dtype)


def segfault_when_causal(q, k, v, *, causal, window, bottom_right, scale):
    if causal:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return _plain(q, k, v, scale)


def segfault_when_causal_and_odd(q, k, v, *, causal, window, bottom_right, scale):
    """Faults on part of the causal cases only (an odd query length), as a misaligned pointer faults on some offset
    buffers and not others: a record taking every causal case is right about most of them, not all."""
    if causal and q.shape[1] % 2:
        ctypes.string_at(0)
    return _plain(q, k, v, scale, causal, bottom_right)


def aborts(q, k, v, *, causal, window, bottom_right, scale):
    os.abort()


def hangs(q, k, v, *, causal, window, bottom_right, scale):
    time.sleep(3600)


SLOW_FIRST_MARKER = "slow_first.marker"


def slow_first(q, k, v, *, causal, window, bottom_right, scale):
    """Correct, but its first call in a working directory takes an hour (a JIT compile that outlasts any limit): it
    leaves a marker there, then sleeps. Later calls, in any process, see the marker and answer at once. The marker is
    relative to the working directory because multiprocessing gives each worker its parent's, while a fork server
    already running keeps the environment it started with."""
    if not os.path.exists(SLOW_FIRST_MARKER):
        open(SLOW_FIRST_MARKER, "w").close()
        time.sleep(3600)
    return _plain(q, k, v, scale, causal, bottom_right)


def raises(q, k, v, *, causal, window, bottom_right, scale):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


_BROKEN = {"device": False}


def breaks_the_process_when_causal(q, k, v, *, causal, window, bottom_right, scale):
    """A sticky device error: a causal case raises (as a misaligned or illegal address does on CUDA), and every
    later call in the same process dies (exit code 1), as the next CUDA call of a process whose context is lost."""
    if _BROKEN["device"]:
        os._exit(1)
    if causal:
        _BROKEN["device"] = True
        raise RuntimeError("CUDA error: misaligned address")
    return _plain(q, k, v, scale)


CUDNN_EXECUTE_FAILED = ("Expected mha_graph->execute(handle, variant_pack, workspace_ptr.get()).is_good() to be true, "
                        "but got false.")  # torch's check in SDPA's cuDNN path (MHA.cpp) when the graph's run fails
_POISONED = {"process": False}


def poisoned_by_cudnn_when_causal(q, k, v, *, causal, window, bottom_right, scale):
    """A causal case fails as a cuDNN graph execution does on a misaligned address (its message names no CUDA
    error), and the next call in the same process dies (exit code 1), as the next CUDA call of a broken context."""
    if _POISONED["process"]:
        os._exit(1)
    if causal:
        _POISONED["process"] = True
        raise RuntimeError(CUDNN_EXECUTE_FAILED)
    return _plain(q, k, v, scale)


def poisoned_silently_when_causal(q, k, v, *, causal, window, bottom_right, scale):
    """Right on every case, but a causal one leaves the process broken without a word: the next call without causal
    in it dies (exit code 1). The death is never the causal case's own (the batch check may call it again)."""
    if _POISONED["process"] and not causal:
        os._exit(1)
    _POISONED["process"] |= causal
    return _plain(q, k, v, scale, causal, bottom_right)


def refuses_causal_loudly(q, k, v, *, causal, window, bottom_right, scale):
    if causal:
        raise ValueError("causal is not implemented")
    return _plain(q, k, v, scale)


segfault_when_causal.supports = lambda case: case.window == (None, None) or "a plain kernel: no windows"
slow_first.supports = segfault_when_causal.supports
poisoned_by_cudnn_when_causal.supports = segfault_when_causal.supports
poisoned_silently_when_causal.supports = segfault_when_causal.supports


STALL_AFTER_FAILURE = "ATTNFUZZ_TEST_STALL_AFTER_FAILURE"


def _failure_logged() -> bool:
    """Whether a lane of the campaign directory named by ATTNFUZZ_TEST_STALL_AFTER_FAILURE logged this kernel's bug."""
    directory = os.environ.get(STALL_AFTER_FAILURE)
    logs = Path(directory, "cases").glob("lane*.jsonl") if directory else ()
    return any('"FAIL:ALL_ZERO"' in log.read_text() for log in logs)


def zero_when_causal(q, k, v, *, causal, window, bottom_right, scale):
    """A silent wrong answer (seed 001's all-zero causal output), for campaigns that must find and keep it.
    With ATTNFUZZ_TEST_STALL_AFTER_FAILURE naming a campaign directory, every call once that campaign has logged
    the failure stalls: its shrink never ends, so a test can kill the campaign in that window without a race."""
    if _failure_logged():
        time.sleep(3600)
    out = _plain(q, k, v, scale)
    return out * 0 if causal else out


zero_when_causal.supports = segfault_when_causal.supports


def zero_slowly(q, k, v, *, causal, window, bottom_right, scale):
    """All zeros, half a second a call: a short campaign's time runs out while it shrinks its first finding."""
    time.sleep(0.5)
    return _plain(q, k, v, scale) * 0


zero_slowly.supports = segfault_when_causal.supports


def nan_when_long(q, k, v, *, causal, window, bottom_right, scale):
    """NaN in every row once a sequence is longer than 4 queries: a second, independent silent bug."""
    out = _plain(q, k, v, scale)
    return out * float("nan") if q.shape[1] > 4 else out


nan_when_long.supports = segfault_when_causal.supports


def nan_when_causal_zero_for_one_query(q, k, v, *, causal, window, bottom_right, scale):
    """Two bugs on one path: a causal case answers NaN, and all zeros when it has one query, so a shrink of the
    NaN bug (FAIL:NONFINITE) toward fewer queries passes into the other (FAIL:ALL_ZERO)."""
    out = _plain(q, k, v, scale)
    if not causal:
        return out
    return out * 0 if q.shape[1] == 1 else out * float("nan")


nan_when_causal_zero_for_one_query.supports = segfault_when_causal.supports


def versioned(q, k, v, *, causal, window, bottom_right, scale):
    """Two releases of one kernel, picked by ATTNFUZZ_TEST_STACK: "old" gives NaN past 4 queries, "new" fixed that
    and returns zeros under causal. The version-diff test replays the same cases on both."""
    out = _plain(q, k, v, scale, causal, bottom_right)
    if os.environ.get("ATTNFUZZ_TEST_STACK") == "new":
        return out * 0 if causal else out
    return out * float("nan") if q.shape[1] > 4 else out


versioned.supports = segfault_when_causal.supports


def skips_empty_sequences(q, k, v, *, causal, window, bottom_right, scale, seqlens_kv=None):
    """Right, except that the rows of a sequence with no keys are never written (TE FusedAttention's bug, corpus
    te-fused-FLAKY-*): they hold whatever the output's memory held, 0 when it is fresh."""
    out = torch.empty(*q.shape[:3], v.shape[3], dtype=q.dtype, device=q.device)
    lens = seqlens_kv.tolist() if seqlens_kv is not None else [k.shape[1]] * q.shape[0]
    for i, n in enumerate(lens):
        if n:
            out[i:i + 1] = _plain(q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n], scale)
    return out


skips_empty_sequences.supports = lambda case: case.left is None and case.right is None or "a plain kernel: no band"


def zero_when_poisoned(q, k, v, *, causal, window, bottom_right, scale):
    """Zeros when memory poisoning is on in its process, else right: tells a test where the switch reached."""
    from attnfuzz.engine import poison
    out = _plain(q, k, v, scale, causal, bottom_right)
    return out * 0 if poison.enabled() else out


zero_when_poisoned.supports = segfault_when_causal.supports


NAP = "ATTNFUZZ_TEST_NAP"  # names a file: while it exists, the napping kernels below sleep on every call


def _nap() -> None:
    path = os.environ.get(NAP)
    while path and os.path.exists(path):
        time.sleep(0.05)


def naps(q, k, v, *, causal, window, bottom_right, scale):
    """Correct, but while the file named by ATTNFUZZ_TEST_NAP exists every call waits for it to go (a compile that
    takes its time): a run interrupted meanwhile is interrupted mid-case."""
    _nap()
    return _plain(q, k, v, scale, causal, bottom_right)


def naps_and_wraps(q, k, v, *, causal, window, bottom_right, scale):
    """naps, but whatever interrupts the wait comes out as a RuntimeError, as from a JIT compiler that reports what
    stopped its compile as its own failure: the KeyboardInterrupt of a Ctrl-C never reaches the harness itself."""
    try:
        _nap()
    except BaseException as e:
        raise RuntimeError(f"compile failed: {type(e).__name__}") from None
    return _plain(q, k, v, scale, causal, bottom_right)


CASES_UNDER = "ATTNFUZZ_TEST_CASES_UNDER"  # a folder whose write-ahead files (.inflight-*.json) say which case runs
_WRONG_IN: list[str] = []                 # the case (its write-ahead text) in which zero_when_causal_then_naps erred


def _running_case() -> str:
    return "".join(p.read_text() for p in sorted(Path(os.environ[CASES_UNDER]).rglob(".inflight-*.json")))


def zero_when_causal_then_naps(q, k, v, *, causal, window, bottom_right, scale):
    """Zeros under causal; and in any case after the first one it erred in (a kernel may be called several times in
    one case: per sequence, for the batch check), every call naps as `naps` does, leaving ATTNFUZZ_TEST_NAP's file +
    ".napping" behind. A run stopped then has graded the failure and is shrinking it. The cases are told apart by
    the write-ahead files under ATTNFUZZ_TEST_CASES_UNDER."""
    running = _running_case()
    if _WRONG_IN and running != _WRONG_IN[0] and os.environ.get(NAP):
        Path(os.environ[NAP] + ".napping").touch()
        _nap()
    out = _plain(q, k, v, scale, causal, bottom_right)
    if causal and running and not _WRONG_IN:   # (a call outside any case, a warm-up, grades nothing)
        _WRONG_IN.append(running)
    return out * 0 if causal else out


naps.supports = segfault_when_causal.supports
naps_and_wraps.supports = segfault_when_causal.supports
zero_when_causal_then_naps.supports = segfault_when_causal.supports


def drops_causal(q, k, v, *, causal, window, bottom_right, scale):
    """Attends to every key whatever `causal` says: one bug, that small cases name three ways (tests/broken.py
    DroppedCausal)."""
    return _plain(q, k, v, scale)


drops_causal.supports = segfault_when_causal.supports


def zero_on_default_isa(q, k, v, *, causal, window, bottom_right, scale):
    """Right, except where torch's CPU kernels run unvectorised (ATen capability DEFAULT: ATEN_CPU_CAPABILITY=default,
    or a CPU without AVX2), where it returns zeros: a kernel wrong on one vector ISA only, as compiled flex is on AVX2
    (corpus flex-compiled-FAIL-*). Which ISA torch runs is fixed when it loads."""
    out = _plain(q, k, v, scale, causal, bottom_right)
    return out * 0 if torch.backends.cpu.get_cpu_capability() == "DEFAULT" else out


zero_on_default_isa.supports = segfault_when_causal.supports


def garbage_when_causal(q, k, v, *, causal, window, bottom_right, scale):
    """One bug under two labels, as a kernel that leaves its output unwritten shows it: under causal the rows read NaN
    once there are more than 4 of them and 0 below (NONFINITE, then ALL_ZERO as a shrink shortens the case)."""
    out = _plain(q, k, v, scale, causal, bottom_right)
    if not causal:
        return out
    return out * float("nan") if q.shape[1] > 4 else out * 0


garbage_when_causal.supports = segfault_when_causal.supports


_CALLS = {"n": 0}


def nan_every_other_call(q, k, v, *, causal, window, bottom_right, scale):
    """NaN on every other call in a process, right on the rest: a failure that does not come back every run."""
    _CALLS["n"] += 1
    out = _plain(q, k, v, scale, causal, bottom_right)
    return out * float("nan") if _CALLS["n"] % 2 else out


nan_every_other_call.supports = segfault_when_causal.supports


def hangs_unless_square(q, k, v, *, causal, window, bottom_right, scale):
    """Right when there are as many keys as queries, else it never answers: a hang that a shrink can walk down (to
    sq = 1, skv = 2 or the like), each hanging step costing what the worker's time limit lets it."""
    if q.shape[1] != k.shape[1]:
        time.sleep(3600)
    return _plain(q, k, v, scale, causal, bottom_right)


hangs_unless_square.supports = segfault_when_causal.supports


MEET = "ATTNFUZZ_TEST_MEET"  # names a folder: the meeting kernel below waits there for a call in another process


def meets_another(q, k, v, *, causal, window, bottom_right, scale):
    """Right only when a call in another process is under way at the same time (each leaves its pid in the folder
    ATTNFUZZ_TEST_MEET names and waits up to 10 s for a second); zeros when it runs alone: replays that run one at a
    time fail, replays that run side by side pass."""
    folder = os.environ[MEET]
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 10
    while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    out = _plain(q, k, v, scale, causal, bottom_right)
    return out if len(os.listdir(folder)) >= 2 else out * 0


SHARED_CACHE = "attnfuzz-shared-cache-test"


def zero_unless_shared_cache(q, k, v, *, causal, window, bottom_right, scale):
    """Right only where TORCHINDUCTOR_CACHE_DIR names a folder called attnfuzz-shared-cache-test: tells a test which
    compile cache its worker was given."""
    out = _plain(q, k, v, scale, causal, bottom_right)
    return out if os.path.basename(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")) == SHARED_CACHE else out * 0


meets_another.supports = segfault_when_causal.supports
zero_unless_shared_cache.supports = segfault_when_causal.supports


def zero_when_avx2(q, k, v, *, causal, window, bottom_right, scale):
    """All zeros whenever torch's CPU kernels run at AVX2 (an AVX2-only CPU, or ATEN_CPU_CAPABILITY=avx2): a bug
    that a search finds only under the ISA its entry was recorded on."""
    out = _plain(q, k, v, scale, causal, bottom_right)
    return out * 0 if torch.backends.cpu.get_cpu_capability() == "AVX2" else out


zero_when_avx2.supports = segfault_when_causal.supports
