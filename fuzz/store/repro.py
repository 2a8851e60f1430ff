"""Standalone repro scripts for corpus entries: torch and the backend are all they need. A script exits 1 while the
bug is there, 0 once it is gone, and 2, naming the module, where what it needs cannot be imported (torch, the
backend's library, and where the script needs them attnfuzz and a bring-your-own kernel's module).

The script embeds the inputs exactly as the fuzzer drew them, in the memory format the backend saw, the float64
oracle's output and the grader's bound of every row, so it checks the backend without the oracle. A case over INLINE
elements is regenerated from the seed instead, with its answers and bounds (store/repro_bounds.py) and a mask over
source.MASK_INLINE elements: that script needs attnfuzz importable. The backend call is the adapter's own
`repro_source(case)`: source defining `attention(q, k, v)` (logical [b, s, heads, d] in, the output out) in the
backend's API, with the masks, sinks and layouts spelled out as run() makes them. Adapters that write their call out:
  sdpa-*                          every spelling and layout SDPA takes (fuzz/backends/sdpa/adapter.py)
  flex-eager, flex-compiled       every case they take (fuzz/backends/flex/repro.py)
  flex-paged                      every case it takes; PagedAttention's caches are rebuilt from the embedded block
                                  table by the adapter's own builders (fuzz/backends/flex/pages.py)
  fa2, fa3, fa4, fa2-kvcache      every case they take (fuzz/backends/flash/repro.py, kvcache.py)
  te-flash, te-fused, te-unfused  every case they take (fuzz/backends/te/repro.py)
  ring-*, te-cp-*                 every case they take; the script spawns the ranks itself (fuzz/backends/cp/repro.py)
  flashinfer-*                    every case they take; a paged cache is rebuilt from the embedded kv_indices
                                  (fuzz/backends/flashinfer/repro.py)
Everything else falls back to calling the adapter through attnfuzz (the script then needs attnfuzz importable):
cases an adapter refuses, and bring-your-own kernels (`package.module:function`), whose module the script imports
by name from the current folder or PYTHONPATH. A script names no folder of the machine it was written on: it goes
into bug reports as it is (attnfuzz.tools.bugreport).

The script checks the output and, for cases with gradients, dQ / dK / dV (autograd through the written call, with the
embedded output gradient and float64 answers). Where `attention` returns (out, lse), lse [b, h, sq] in natural log,
it checks the LSE too, each row against its own bound and -inf exactly on a row that sees no key. A written call
that returns one says so with a line `RETURNS_LSE = True`; an LSE finding whose written call returns none calls the
adapter through attnfuzz instead, which hands back the LSE the adapter graded.
A BATCH_VARIANT finding's script also reruns the batch check through attnfuzz (attnfuzz.engine.batch.compare): the
batch, the sequence alone and the batch reversed, with a line per tensor whose bits differ. CP scripts gather the output across ranks, so no gradient flows back
through them; they say so and check the output only.
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

from attnfuzz.backends.source import guarded_import, literal
from attnfuzz.store.isa import ONEDNN_ISA
from attnfuzz.store.repro_bounds import bounds_source, get_family, row_bounds
from attnfuzz.oracles.grade import Oracle
from attnfuzz.strategies.case import PLAIN_STORAGE, Case
from attnfuzz.strategies.materialize import materialize, stored

INLINE = 1 << 16

# Where a script calls the backend through attnfuzz: BACKEND from the registry, or a bring-your-own kernel's module
# (KERNEL_MODULE) by name, from the current folder or PYTHONPATH.
_THROUGH_ATTNFUZZ = '''


def _backend(what):
    """BACKEND's adapter, through attnfuzz; exits 2 (1 means the bug is there) when it cannot be made here."""
    import os
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # as the attnfuzz command does: a kernel's module from the current folder
    try:
        from attnfuzz.backends import get
        return get(BACKEND, DEVICE)
    except (ImportError, ValueError) as e:  # attnfuzz, or the kernel's module, is not importable here
        how = f" (run it from the folder where `import {KERNEL_MODULE}` works)" if KERNEL_MODULE else ""
        print(f"{BACKEND}: cannot run {what} here: {e}{how}", file=sys.stderr)
        sys.exit(2)
'''

_ADAPTER_CALL = '''

def attention(q, k, v):
    """No standalone spelling for this backend or case: call it through attnfuzz's adapter."""
    backend = _backend("this repro")
    from attnfuzz.strategies import Case, materialize
    case = Case.from_dict(CASE)
    t = materialize(case, DEVICE)
    t = type(t)(q=q, k=k, v=v, mask=t.mask, sink=t.sink, alibi=t.alibi, dout=t.dout)
    result = backend.run(case, t)
    return result.out if result.lse is None else (result.out, result.lse)
'''

_CHECK_LSE = '''

def check_lse(lse, want):
    """The LSE against the float64 one: -inf exactly on a row that sees no key, else within its row's bound."""
    lse, want = lse.detach().to("cpu", torch.float64), want.to("cpu", torch.float64)
    if lse.shape != want.shape:
        return [f"wrong shape: lse got {tuple(lse.shape)}, expected {tuple(want.shape)} (b, h, sq)"]
    rows = (torch.arange(want.shape[2])[None, :] < torch.tensor(VALID_ROWS)[:, None])[:, None, :].expand_as(want)
    empty, graded = rows & torch.isinf(want), rows & torch.isfinite(want)
    over = ((lse - want).abs() / LSE_BOUNDS)[graded].nan_to_num(nan=float("inf"), posinf=float("inf"))
    over = over.max().item() if over.numel() else 0.0
    err = (lse - want)[graded].abs().max().item() if graded.any() else 0.0
    print(f"{BACKEND}: max |lse - float64| = {err:.4g}; worst row at {over:.4g} x its bound")
    problems = []
    if not torch.equal(lse[empty], want[empty]):
        problems.append("lse of a row that sees no key is not -inf")
    if not over <= 1:
        problems.append(f"max |lse - float64| = {err:.4g}: a row's error > bound ({over:.4g} x its own)")
    return problems
'''

_BATCH_RUNS = '''

def batch_runs():
    """The check that found this, through attnfuzz: the case's batch, then one sequence alone (b = 1, its own
    lengths, the same values) and the batch reversed; a line per tensor whose bits differ from the batch's."""
    backend = _backend("the batch check")
    from attnfuzz.engine.batch import compare
    from attnfuzz.strategies import Case, materialize
    case = Case.from_dict(CASE)
    t = materialize(case, DEVICE)
    check = compare(backend, case, t, backend.run(case, t))
    print(f"{BACKEND}: sequence {check.sequence} alone and the batch reversed, against the batch: "
          + (check.refused or ("the same bits" if check.invariant else f"{len(check.differences)} difference(s)")))
    return list(check.differences)
'''

# How materialize() lays the drawn values out in memory, rebuilt from the contiguous literals.
_MEMORY = {
    "transposed": "q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))  # head-major buffers",
    "expanded_kv": "k, v = (x[:, :, :1].expand(x.shape) for x in (k, v))  # one KV head seen hk times, stride 0",
}


def _inputs(case: Case, t) -> str:
    """Source binding q, k, v on DEVICE: exact literals in the case's memory format and storage."""
    lines = [f"{name} = {literal(x)}.to(DEVICE)" for name, x in (("q", t.q), ("k", t.k), ("v", t.v))]
    if case.memory in _MEMORY:
        lines.append(_MEMORY[case.memory])
    if case.storage != PLAIN_STORAGE:  # the buffers the backend saw: materialize's own function, embedded
        lines += ["", "", inspect.getsource(stored).rstrip(), "", "",
                  f"q, k, v = (stored(x, kind) for x, kind in zip((q, k, v), {case.storage!r}))  # storage"]
    return "\n".join(lines)


def script(entry) -> str:
    """The repro script's source for one corpus entry."""
    case, device = entry.case, "cpu"
    t = materialize(case, device)
    oracle = Oracle.of(case, t)
    family = get_family(entry)
    bounds = row_bounds(oracle, family)
    small = sum(x.numel() for x in (t.q, t.k, t.v, oracle.ref.out)) <= INLINE
    if small:
        inputs, expected = _inputs(case, t), f"EXPECTED = {literal(oracle.ref.out)}"
        expected_lse = f"EXPECTED_LSE = {literal(oracle.ref.lse)}"
    else:
        inputs = ("from attnfuzz.strategies import Case, materialize  # too large to inline: regenerated from the seed\n"
                  "_t = materialize(Case.from_dict(CASE), DEVICE)\nq, k, v = _t.q, _t.k, _t.v")
        expected = ("from attnfuzz.oracles.reference import reference\n"
                    "_ref = reference(Case.from_dict(CASE), _t)\nEXPECTED = _ref.out")
        expected_lse = "EXPECTED_LSE = _ref.lse"
    if case.grads:  # the backend saw leaves that require grad (its forward may take another path for them)
        inputs += "\nq, k, v = (x.detach().requires_grad_() for x in (q, k, v))"
        expected += "\n" + _expected_grads(oracle, t, small)
    call = written_call(entry)
    if call is not None and entry.verdict.diagnosis == "LSE" and "RETURNS_LSE = True" not in call:
        call = None  # the written call returns no LSE: the adapter's does
    through = call is None
    if through:
        call = _ADAPTER_CALL
        if case.fp8 is not None:  # the kernel takes the encodings and descales, which materialize gives from the seed
            call = call.replace("dout=t.dout)", "dout=t.dout, fp8=t.fp8)")
        exits = "exits 1 while the bug is there, 2 when torch, attnfuzz or the kernel cannot be imported here"
    else:
        exits = "exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here"
    rows_list = list(case.lens_q)
    batch = entry.verdict.diagnosis == "BATCH_VARIANT"
    if batch:
        call += _BATCH_RUNS
        exits += "; the batch check needs attnfuzz importable"
    module = kernel_module(entry)
    if through or batch:
        why = "the kernel's module, from the current folder or PYTHONPATH" if module else "a registered backend"
        call = f"\n\nKERNEL_MODULE = {module!r}  # {why}" + _THROUGH_ATTNFUZZ + call
    where = f"\nfrom the folder where `import {module}` works, or with that folder on PYTHONPATH" if module else ""
    return f'''"""attnfuzz repro: {entry.backend} {entry.verdict.label}
{textwrap.fill(entry.verdict.message, 110)}

Run with: python3 {Path(entry.filename).with_suffix(".py").name}   ({exits}){where}
"""
{_isa_pin(entry)}import sys

BACKEND = {entry.backend!r}
DEVICE = {entry.device!r}
CASE = {case.to_dict()!r}

{guarded_import("import torch", "exits 2 without it: 1 says the bug is there")}
VALID_ROWS = {rows_list!r}  # graded query rows per sequence (rows past them are padding)
{bounds_source(bounds, small)}
{call.rstrip()}


def main():
{textwrap.indent(inputs, "    ")}
{textwrap.indent(expected, "    ")}

    raw = attention(q, k, v)
    lse = raw[1] if isinstance(raw, tuple) and len(raw) > 1 and isinstance(raw[1], torch.Tensor) else None
    raw = raw[0] if isinstance(raw, tuple) else raw
    out = raw.detach().to("cpu", torch.float64)
    want = EXPECTED.to("cpu", torch.float64)
    if out.shape != want.shape:  # before the checks below, which index it by the contract's axes
        print(f"{{BACKEND}}: wrong shape: got {{tuple(out.shape)}}, expected {{tuple(want.shape)}} (b, sq, h, d_v)")
        return 1
    rows = torch.arange(out.shape[1])[None, :] < torch.tensor(VALID_ROWS)[:, None]
    got, want = out[rows], want[rows]
    err = (got - want).abs().max().item() if got.numel() else 0.0
    over = ((out - EXPECTED.to("cpu", torch.float64)).abs().amax(-1) / ROW_BOUNDS.to(torch.float64))[rows]
    over = over.nan_to_num(nan=float("inf")).max().item() if over.numel() else 0.0
    problems = []
    if not torch.isfinite(got).all():
        problems.append("non-finite output")
    if got.numel() and (got == 0).all() and (want != 0).any():
        problems.append("all-zero output")
    if not over <= 1:
        problems.append(f"max |out - float64| = {{err:.4g}}: a row's error > bound ({{over:.4g}} x its own)")
    print(f"{{BACKEND}}: max |out - float64| = {{err:.4g}}; worst row at {{over:.4g}} x its bound (largest {{BOUND:.4g}})")
{_isa_report(entry)}    if lse is not None:
{textwrap.indent(expected_lse, "        ")}
        problems += check_lse(lse, EXPECTED_LSE)
    if {case.grads!r}:
        problems += check_grads(raw, q, k, v, DOUT, EXPECTED_GRADS)
{"    problems += batch_runs()" + chr(10) if batch else ""}    if problems:
        print("  " + "\\n  ".join(problems))
    return 1 if problems else 0


{_CHECK_LSE}
{_CHECK_GRADS if case.grads else ""}
if __name__ == "__main__":  # the guard lets backends that spawn processes (context parallelism) import this file
{_WATCHDOG if entry.verdict.status == "HANG" else ""}{_main_call(entry)}'''


_MAIN_CALL = """    try:
        code = main()
    except ImportError as e:  # the backend's library (imported by the call), or attnfuzz where the script needs it
        print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is",
              file=sys.stderr)
        sys.exit(2)  # not 1: 1 says the bug is there
    sys.exit(code)
"""


def _main_call(entry) -> str:
    """The guard's call of main(): exit 2 when what the call needs cannot be imported, except for an entry whose
    failure is an import error (a library that fails to import a part of itself on some case): that is its bug."""
    if any(name in (entry.verdict.diagnosis or "") for name in ("ImportError", "ModuleNotFoundError")):
        return "    sys.exit(main())\n"
    return _MAIN_CALL


def _isa(entry) -> str | None:
    return entry.recorded_isa(entry.device)


def _isa_pin(entry) -> str:
    """A CPU entry's script runs under the vector ISA the entry was found under, unless ATEN_CPU_CAPABILITY says
    otherwise: torch reads it once, when it loads, so it is set before `import torch`."""
    isa = _isa(entry)
    if isa is None:
        return ""
    pin = (f"import os\n\nRECORDED_ISA = {isa!r}  # the CPU vector ISA this entry was found under\n"
           f"os.environ.setdefault(\"ATEN_CPU_CAPABILITY\", RECORDED_ISA.lower())  # read once, when torch loads\n")
    onednn = ONEDNN_ISA.get(isa.lower())
    if onednn is None:
        return pin
    return pin + (f"if os.environ[\"ATEN_CPU_CAPABILITY\"] == RECORDED_ISA.lower():  # oneDNN picks its own ISA: "
                  f"hold it there too\n    os.environ.setdefault(\"ONEDNN_MAX_CPU_ISA\", {onednn!r})\n")


def _isa_report(entry) -> str:
    if _isa(entry) is None:
        return ""
    return ('''    isa = torch.backends.cpu.get_cpu_capability()
    print(f"CPU ISA {isa}" + ("" if isa == RECORDED_ISA else f"; recorded on {RECORDED_ISA}, which this run is not "
                                                             f"(ATEN_CPU_CAPABILITY, or a CPU without it)"))
''')


_WATCHDOG = '''    # the fuzzer saw this case hang: give up after WATCHDOG_S seconds and exit 1, as for any bug still there
    import os
    import threading
    WATCHDOG_S = float(os.environ.get("ATTNFUZZ_REPRO_WATCHDOG", 900))  # the worker's 300 s, then 600 s more

    def _give_up():
        print(f"{BACKEND}: no answer within {WATCHDOG_S:g}s: the hang is still there", flush=True)
        os._exit(1)  # from this thread: the main one may be stuck inside a kernel or a compile

    _watchdog = threading.Timer(WATCHDOG_S, _give_up)
    _watchdog.daemon = True
    _watchdog.start()
'''

_CHECK_GRADS = '''
def check_grads(out, q, k, v, dout, expected):
    """dQ, dK, dV by autograd through the call, each row (query or key, head) against its float64 answer within the
    bound the fuzzer graded that row with (GRAD_ROW_BOUNDS; inf: a row not graded)."""
    if not out.requires_grad:
        print("  gradients not checked: this call's output is not differentiable here")
        return []
    grads = torch.autograd.grad(out, (q, k, v), dout.to(out.device, out.dtype))
    problems = []
    for name, got in zip(("dq", "dk", "dv"), grads):
        got, want = got.detach().to("cpu", torch.float64), expected[name].to("cpu", torch.float64)
        bounds = GRAD_ROW_BOUNDS[name].to(torch.float64)
        graded = torch.isfinite(bounds)
        if not graded.any():
            continue
        err = (got - want).abs().amax(-1).nan_to_num(nan=float("inf"))[graded]
        ratios = err / bounds[graded]
        worst = int(ratios.argmax())
        over = ratios[worst].item()
        print(f"{BACKEND}: max |{name} - float64| = {err.max().item():.4g}; worst row at {over:.4g} x its bound")
        if not torch.isfinite(got.amax(-1)[graded]).all():
            problems.append(f"non-finite {name}")
        elif not over <= 1.0:
            problems.append(f"max |{name} - float64| on its worst row = {err[worst].item():.4g} > bound "
                            f"{bounds[graded][worst].item():.4g} ({over:.4g} x)")
    return problems

'''


def _expected_grads(oracle: Oracle, t, small: bool) -> str:
    """Source of main()'s lines binding DOUT and EXPECTED_GRADS."""
    if small:
        grads = ", ".join(f"{n!r}: {literal(getattr(oracle.ref, n))}" for n in ("dq", "dk", "dv"))
        return f"DOUT = {literal(t.dout)}\nEXPECTED_GRADS = {{{grads}}}"
    return ("DOUT = _t.dout\n"   # _ref: the reference the expected output was taken from, gradients and all
            "EXPECTED_GRADS = {'dq': _ref.dq, 'dk': _ref.dk, 'dv': _ref.dv}")


def written_call(entry) -> str | None:
    """The adapter's own source for `attention(q, k, v)`, or None where it has no writer for the case."""
    from attnfuzz.backends import get
    try:
        backend = get(entry.backend, entry.device)
    except ValueError:
        return None
    return backend.repro_source(entry.case)


def kernel_module(entry) -> str | None:
    """A bring-your-own kernel's module ('package.module' of 'package.module:function'); None for a registered
    backend. The script imports it by name, never from a folder of the machine it was written on."""
    return entry.backend.partition(":")[0] if ":" in entry.backend else None


def write_repro(entry, path: Path) -> Path:
    path.write_text(script(entry))
    return path
