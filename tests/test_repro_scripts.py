"""Standalone repro scripts that spell the backend call out (fuzz/store/repro.py and the adapters' repro_source): they run
under `python -I` with attnfuzz's packages refused, pass on a correct backend, fail once the call in the script is
broken, and make the same call, with the same arguments, as the adapter's run() for cases drawn from its strategy.
FA2 / FA3 / FA4, TransformerEngine and FlashInfer (tests/test_backend_flashinfer.py) run against the fakes in
tests/fakes/; flex and ring attention for real, compiled
flex through dynamo alone (torch.compile with the eager backend: the script is checked, not inductor)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

from attnfuzz.store import corpus as corpus_io
from attnfuzz.backends import get
from attnfuzz.backends.flash.fa2 import FlashAttn2
from attnfuzz.backends.flash.fa3 import FlashAttn3
from attnfuzz.backends.flash.fa4 import FlashAttn4
from attnfuzz.backends.cp import shard
from attnfuzz.backends.cp.te import translate
from attnfuzz.engine.harness import cases_for
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.space import Space
from tests.fakes import flash_attn as fake_fa
from tests.fakes.transformer_engine import FakeTE

warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
REPO = Path(__file__).resolve().parents[1]
PLANTED = V.Verdict(V.FAIL, V.TOLERANCE, "planted: the script is checked, not the backend", None)
ATTNFUZZ = re.compile(r"\b(fuzz|strategies|oracles)\.|\b(import|from) (fuzz|strategies|oracles)\b")
SPACE = Space(max_batch=3, max_len=12, max_heads=4, max_head_dim=16)

# Runs a script as `python -I script.py` would, with attnfuzz's packages refused and, when named, fake libraries put
# in sys.modules; the calls the fakes record are written to calls.json beside the script.
LAUNCHER = """
import json, runpy, sys

class NoAttnfuzz:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fuzz", "strategies", "oracles"):
            raise ImportError(f"{name}: attnfuzz must not be needed by a standalone repro")

sys.meta_path.insert(0, NoAttnfuzz())
sys.path.insert(0, REPO)  # for tests.fakes only
calls = []
if FAKE == "te":
    from tests.fakes.transformer_engine import FakeTE
    fake = FakeTE()
    sys.modules.update(fake.modules)
    calls = fake.forwards
elif FAKE == "compile":  # torch.compile records its calls and compiles through dynamo alone (no inductor kernels)
    import torch
    _compile = torch.compile
    def _recorded(model, **options):
        calls.append({"compiled": getattr(model, "__name__", repr(model)), **options})
        return _compile(model, backend="eager", **options)
    torch.compile = _recorded
elif FAKE == "flashinfer":
    from tests.fakes import flashinfer
    sys.modules.update(flashinfer.make_flashinfer(calls))
elif FAKE:
    from tests.fakes import flash_attn
    sys.modules.update(getattr(flash_attn, "make_" + FAKE)(calls))
try:
    runpy.run_path(SCRIPT, run_name="__main__")
finally:
    if FAKE == "te":  # the forwards, and which backend the fake's selection ran (NVTE_* decide it)
        calls = {"forwards": calls, "selected": [f for f, on in fake.record.items() if f.startswith("use_") and on]}
    with open(SCRIPT + ".calls.json", "w") as f:
        json.dump(calls, f, default=lambda x: x.tolist() if hasattr(x, "tolist") else repr(x))
"""


def write(tmp_path: Path, backend: str, case: Case, device: str = "cpu") -> Path:
    """The repro script of a corpus entry for `case`, as `attnfuzz` saves it."""
    entry = corpus_io.Entry(backend=backend, case=case, verdict=PLANTED, device=device)
    return corpus_io.save(tmp_path, entry).with_suffix(".py")


def run_alone(path: Path, fake: str = "") -> tuple[subprocess.CompletedProcess, list]:
    """Run the script isolated (-I, attnfuzz refused, `fake` installed: fa2 / fa3 / fa4 / te); (result, calls)."""
    launcher = LAUNCHER.replace("REPO", repr(str(REPO))).replace("SCRIPT", repr(str(path))).replace(
        "FAKE", repr(fake))
    result = subprocess.run([sys.executable, "-I", "-c", launcher], capture_output=True, text=True,
                            cwd=path.parent, timeout=600)
    calls_file = Path(str(path) + ".calls.json")
    return result, json.loads(calls_file.read_text()) if calls_file.exists() else []


def broken(text: str) -> str:
    """The script with attention()'s output multiplied by 0."""
    start = text.index("def attention(q, k, v):")
    at = text.index("\n    return ", start) + len("\n    return ")
    return text[:at] + "0 * " + text[at:]


def assert_standalone_and_able_to_fail(path: Path, fake: str = "") -> list:
    """The script spells its call out, passes alone, and fails (exit 1) with the call's output zeroed."""
    text = path.read_text()
    assert not ATTNFUZZ.search(text), ATTNFUZZ.search(text)
    ok, calls = run_alone(path, fake)
    assert ok.returncode == 0, ok.stdout + ok.stderr[-3000:]
    path.write_text(broken(text))
    bad, _ = run_alone(path, fake)
    assert bad.returncode == 1 and "all-zero output" in bad.stdout, bad.stdout + bad.stderr[-3000:]
    return calls


# -- flex_attention --------------------------------------------------------------------------------------------------
FLEX_CASES = [
    Case(b=2, sq=12, skv=20, h=2, seqlens_q=(12, 3), seqlens_kv=(7, 20), window=(2, 1), alignment="bottom_right",
         alibi_slopes=(0.5, 0.25), softcap=5.0, spelling="score_mask"),
    Case(b=3, sq=8, skv=10, h=4, hk=2, seqlens_q=(5, 8, 2), seqlens_kv=(8, 4, 10), layout="thd", causal=True,
         mask_density=0.7, dtype="bfloat16", memory="expanded_kv", spelling="repeat_kv"),
]


@pytest.mark.parametrize("case", FLEX_CASES, ids=["bshd-score_mask", "thd-block_mask"])
def test_flex_eager_script_runs_alone_and_can_fail(tmp_path, case):
    assert get("flex-eager").unsupported(case) is None
    assert_standalone_and_able_to_fail(write(tmp_path, "flex-eager", case))


def test_flex_compiled_script_compiles_the_call(tmp_path):
    """The script hands flex_attention to torch.compile; here torch.compile compiles through dynamo alone, so the
    script is checked, not inductor's kernels for this host's ISA (fuzzed, and in corpus/ where they are wrong)."""
    path = write(tmp_path, "flex-compiled", Case(sq=16, skv=16, causal=True, dtype="float32", seed=1))
    assert "torch.compile(flex_attention, fullgraph=True" in path.read_text()
    calls = assert_standalone_and_able_to_fail(path, fake="compile")
    assert calls == [{"compiled": "flex_attention", "fullgraph": True, "dynamic": False}], calls


@pytest.mark.slow
def test_flex_source_computes_what_run_computes():
    """For cases drawn from flex-eager's strategy, the written-out call gives run()'s output bit for bit."""
    layouts = Counter(case.layout for case in compared_on_drawn_cases(get("flex-eager"), lambda: None, 60))
    assert sum(layouts.values()) >= 40 and set(layouts) == {"bshd", "sbhd", "thd"}, layouts


def compared_on_drawn_cases(backend, last_call, examples: int) -> list[Case]:
    """For cases drawn from the backend's strategy that it takes, run() and the written-out call give the same
    output bit for bit, and `last_call()` (what a fake library recorded last) is the same after each; the cases."""
    compared = []

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases_for(backend, SPACE))
    def check(case):
        assume(backend.unsupported(case) is None)  # refused cases do not count toward `examples`
        t = materialize(case)
        result = backend.run(case, t)
        want = result.out
        by_run = comparable(last_call())
        got = written(backend, case)(t.q, t.k, t.v)
        rows = torch.arange(case.sq)[None] < torch.tensor(case.lens_q)[:, None]
        if isinstance(got, tuple):  # (out, lse): the LSE the script checks is run()'s too
            got, lse = got
            assert torch.equal(lse.transpose(1, 2)[rows], result.lse.transpose(1, 2)[rows]), case
        assert torch.equal(got[rows], want[rows]), case
        assert comparable(last_call()) == by_run, case
        compared.append(case)

    check()
    return compared


def written(backend, case: Case):
    """`attention` from the backend's repro source, defined in a fresh namespace."""
    source = backend.repro_source(case)
    assert source is not None, case
    namespace = {"torch": torch}
    exec(compile(source, f"<repro of {backend.name}>", "exec"), namespace)
    return namespace["attention"]


# -- flash-attn 2 / 3 / 4 (fakes) -------------------------------------------------------------------------------------
FLASH = {"fa2": (FlashAttn2, fake_fa.make_fa2), "fa3": (FlashAttn3, fake_fa.make_fa3),
         "fa4": (FlashAttn4, fake_fa.make_fa4)}
FLASH_CASES = {
    "fa2": Case(b=2, sq=8, skv=11, h=2, seqlens_q=(3, 8), seqlens_kv=(11, 5), alibi_slopes=(0.5, 0.25), causal=True,
                alignment="bottom_right", dtype="bfloat16", spelling="causal+window"),
    "fa3": Case(b=2, sq=8, skv=8, h=4, hk=2, layout="sbhd", window=(2, None), dtype="float16", softcap=4.0,
                spelling="wide"),
    "fa4": Case(b=2, sq=8, skv=11, h=2, seqlens_q=(3, 8), seqlens_kv=(11, 5), softmax="learnable", causal=True,
                alignment="bottom_right", dtype="bfloat16", spelling="seqused+causal+window"),
}


def comparable(call: dict) -> str:
    """A recorded call as JSON, tensors as nested lists (how the launcher writes the script's calls)."""
    return json.dumps(call, sort_keys=True, default=lambda x: x.tolist() if hasattr(x, "tolist") else repr(x))


@pytest.mark.parametrize("name", sorted(FLASH_CASES))
def test_flash_script_makes_the_adapters_call(tmp_path, monkeypatch, name):
    cls, make = FLASH[name]
    calls: list = []
    fake_fa.install(monkeypatch, make(calls))
    case = FLASH_CASES[name]
    assert cls("cpu").unsupported(case) is None
    cls("cpu").run(case, materialize(case))
    script_calls = assert_standalone_and_able_to_fail(write(tmp_path, name, case), fake=name)
    assert [json.loads(comparable(c)) for c in calls] == script_calls


@pytest.mark.parametrize("name", sorted(FLASH))
def test_flash_source_spells_what_run_passes(monkeypatch, name):
    """Over cases drawn from the adapter's strategy, the written call reaches the library with the arguments run()
    gives it (causal flag, window tuple, softcap, cu_seqlens, seqused, sinks, ALiBi) and gives run()'s output."""
    cls, make = FLASH[name]
    calls: list = []
    fake_fa.install(monkeypatch, make(calls))
    spellings = Counter(case.spelling for case in compared_on_drawn_cases(cls("cpu"), lambda: calls[-1], 150))
    assert sum(spellings.values()) >= 20 and len(spellings) >= 3, spellings


# -- TransformerEngine (fake) -----------------------------------------------------------------------------------------
TE_CASES = {
    "te-unfused": Case(b=2, sq=5, skv=7, h=4, hk=2, d_qk=16, d_v=8, softcap=3.0, scale=0.4, softmax="learnable",
                       seqlens_q=(3, 5), seqlens_kv=(7, 2), alibi_slopes=(0.1, 0.2, 0.3, 0.4),
                       alignment="bottom_right", layout="sbhd", spelling="attention_mask"),
    "te-fused": Case(b=2, sq=8, skv=8, h=2, layout="thd", seqlens_q=(3, 8), seqlens_kv=(8, 5), causal=True,
                     dtype="bfloat16", spelling="forward-args"),
}


@pytest.mark.parametrize("name", sorted(TE_CASES))
def test_te_script_makes_the_adapters_call(tmp_path, monkeypatch, name):
    fake = FakeTE().install(monkeypatch)
    case = TE_CASES[name]
    backend = get(name, "cpu")
    assert backend.unsupported(case) is None, backend.unsupported(case)
    backend.run(case, materialize(case))
    path = write(tmp_path, name, case)
    script_calls = assert_standalone_and_able_to_fail(path, fake="te")
    assert [json.loads(comparable(c)) for c in fake.forwards] == script_calls["forwards"]
    assert script_calls["selected"] == [f"use_{name.split('-')[1]}_attention"]


@pytest.mark.parametrize("name", ["te-flash", "te-fused", "te-unfused"])
def test_te_source_spells_what_run_passes(monkeypatch, name):
    """Over drawn cases, the written module and call get run()'s construction and forward arguments (mask type,
    window, bottom_right_diagonal, qkv_format, cu_seqlens, attention_mask, ALiBi) and give run()'s output, with
    only the adapter's backend switched on."""
    fake = FakeTE().install(monkeypatch)
    for variable in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):
        monkeypatch.delenv(variable, raising=False)

    def last_call():
        selected = [flag for flag in ("use_flash_attention", "use_fused_attention", "use_unfused_attention")
                    if fake.record[flag]]
        return fake.inits[-1], fake.forwards[-1], selected

    spellings = Counter(case.spelling for case in compared_on_drawn_cases(get(name, "cpu"), last_call, 60))
    assert sum(spellings.values()) >= 10 and len(spellings) >= 2, spellings


# -- context parallelism ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_ring_script_spawns_its_ranks_and_can_fail(tmp_path):
    case = Case(b=2, sq=8, skv=8, h=2, hk=1, causal=True, dtype="float32", seed=4)
    assert get("ring-allgather").unsupported(case) is None
    path = write(tmp_path, "ring-allgather", case)
    assert "mp.spawn(run_rank" in path.read_text() and "head_tail(8, WORLD)" in path.read_text()
    assert_standalone_and_able_to_fail(path)


def _call_node(tree: ast.AST, func: str) -> ast.Call:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == func)


@pytest.mark.parametrize("name", ["te-cp-p2p-fused", "te-cp-all_gather-flash", "te-cp-a2a-fused",
                                  "te-cp-a2a+p2p-fused"])
def test_te_cp_source_spells_translate_and_gathers_the_pools_shards(monkeypatch, name):
    """No TE and no GPUs here: the written TE CP call is read back from the source and must equal the engine's
    translate(case) (construction, cu_seqlens, NVTE_* switches, comm type); the script's shards must be the pool's,
    and its gather must put the pool's shards back in order (run with a stand-in for mp.spawn)."""
    backend = get(name, "cuda")
    engine = backend.engine
    layouts: Counter = Counter()

    @settings(max_examples=25, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=backend.cases(max_units=2, long_units=()))
    def check(case):
        call = translate(case, engine.kernel, engine.world)
        source = backend.repro_source(case)
        tree = ast.parse(source)
        init = {kw.arg: ast.literal_eval(kw.value) for kw in _call_node(tree, "te.DotProductAttention").keywords}
        assert init == call.init
        forward = {kw.arg: ast.literal_eval(kw.value.args[0]) for kw in _call_node(tree, "dpa").keywords}
        assert forward == call.cu_seqlens
        assert ast.unparse(_call_node(tree, "os.environ.update").args[0]) == "NVTE"
        assert ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign)
                                     and ast.unparse(n.targets[0]) == "NVTE")) == call.env
        assert ast.literal_eval(_call_node(tree, "dpa.set_context_parallel_group").args[-1]) == engine.comm_type
        namespace = {"torch": torch}
        exec(compile(source, name, "exec"), namespace)
        plan = shard.plan(engine.convention(case), case, engine.world)
        assert namespace["WORLD"] == engine.world
        assert all(torch.equal(a, b) for a, b in zip(namespace["Q_PARTS"], plan.q_parts))
        assert all(torch.equal(a, b) for a, b in zip(namespace["KV_PARTS"], plan.kv_parts))

        def ranks_return_their_q(run_rank, args, nprocs):
            """Stands in for mp.spawn: every rank saves its shard of q, as the pool cuts it."""
            tmp, q = args[0], args[1]
            whole = shard.pack_padded(q, case.lens_q, plan.padded_q) if plan.packed else q
            for rank, piece in enumerate(shard.shard(whole, list(plan.q_parts), 0 if plan.packed else 1)):
                torch.save(piece, f"{tmp}/out{rank}.pt")

        monkeypatch.setattr(torch.multiprocessing, "spawn", ranks_return_their_q)
        q = materialize(case).q
        gathered = namespace["attention"](q, q, q)
        rows = torch.arange(case.sq)[None] < torch.tensor(case.lens_q)[:, None]
        assert torch.equal(gathered[rows], q[rows]), case
        layouts[case.layout] += 1

    check()
    assert sum(layouts.values()) >= 10 and len(layouts) >= 2, layouts


def test_a_hang_entrys_script_gives_up_and_exits_1_while_the_hang_is_there(tmp_path):
    """"Exits 1 while the bug is there" holds for a hang too: a watchdog thread ends the script after
    ATTNFUZZ_REPRO_WATCHDOG seconds (900 by default), even with the main thread stuck in the call."""
    hang = V.Verdict(V.HANG, "TIMEOUT", "no answer within 1s")
    case = Case(sq=2, skv=2, d_qk=8, d_v=8)
    script = corpus_io.save(tmp_path, corpus_io.Entry("tests.misbehaving:hangs", case, hang)).with_suffix(".py")
    env = {**os.environ, "ATTNFUZZ_REPRO_WATCHDOG": "2", "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                            timeout=120)
    assert result.returncode == 1 and "the hang is still there" in result.stdout, result.stdout + result.stderr
    assert time.perf_counter() - start < 60
    fine = corpus_io.save(tmp_path, corpus_io.Entry("sdpa-math", case, PLANTED)).with_suffix(".py")
    assert "WATCHDOG" not in fine.read_text()          # only a hang's script carries the watchdog


def _hidden(tmp_path, *modules: str) -> dict:
    """An environment in which importing each of `modules` fails as a missing module does (a folder of stand-ins that
    raise, first on PYTHONPATH), the rest as it is."""
    hide = tmp_path / "hide"
    hide.mkdir(exist_ok=True)
    for name in modules:
        (hide / f"{name}.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n")
    return {**os.environ, "PYTHONPATH": str(hide)}


def _ran(repro: Path, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(repro)], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_a_script_exits_2_naming_torch_where_torch_cannot_be_imported(tmp_path):
    """Exit 1 says the bug is there; a script that cannot even start says 2, and which module it lacks."""
    case = Case(sq=2, skv=3, d_qk=8, d_v=8, causal=True)
    repro = corpus_io.save(tmp_path, corpus_io.Entry("sdpa-math", case, PLANTED)).with_suffix(".py")
    assert _ran(repro, {**os.environ}, tmp_path).returncode == 0  # control: with torch, a correct backend passes
    ran = _ran(repro, _hidden(tmp_path, "torch"), tmp_path)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "sdpa-math: cannot run this repro here: No module named 'torch'" in ran.stderr and "Traceback" not in \
        ran.stderr, ran.stderr


def test_a_script_exits_2_naming_the_backends_library_where_it_cannot_be_imported(tmp_path):
    """FA2's call imports flash_attn when it runs; hidden here (installed or not), the script says so and exits 2.
    An entry whose bug is an import error (CRASH:ModuleNotFoundError) still exits 1 when it comes back."""
    case = Case(sq=2, skv=3, d_qk=8, d_v=8, dtype="float16")
    env = _hidden(tmp_path, "flash_attn")
    repro = corpus_io.save(tmp_path, corpus_io.Entry("fa2", case, PLANTED, device="cpu")).with_suffix(".py")
    ran = _ran(repro, env, tmp_path)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "fa2: cannot run this repro here: No module named 'flash_attn'" in ran.stderr, ran.stderr
    crash = V.Verdict(V.CRASH, "ModuleNotFoundError", "ModuleNotFoundError: No module named 'flash_attn'")
    crashed = corpus_io.save(tmp_path / "crash", corpus_io.Entry("fa2", case, crash, device="cpu")).with_suffix(".py")
    assert _ran(crashed, env, tmp_path).returncode == 1  # the control: that import error is the bug, still there
