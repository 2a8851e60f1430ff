"""The CPU vector ISA an entry was found under: recorded, replayed under it, pinned in its script, and stood in for
(ATEN_CPU_CAPABILITY, with oneDNN held to the same ISA below AVX-512: attnfuzz.store.isa)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import replay as replay_io
from attnfuzz.store.isa import emulating
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from tests.test_corpus import _entry


def test_the_environment_names_the_isa_and_the_variable_that_chose_it(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert "ATEN_CPU_CAPABILITY" not in corpus_io.environment("cpu")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    env = corpus_io.environment("cuda")
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["cpu_capability"] == corpus_io.host_isa()


ISA_BUG = "tests.misbehaving:zero_on_default_isa"   # zeros where torch runs unvectorised (DEFAULT), right elsewhere
ISA_CASE = Case(sq=4, skv=6, d_qk=8, d_v=8, causal=True, seed=2)


def _under_isa(tmp_path, isa: str, known: bool = True, repro: bool = False, backend: str = ISA_BUG):
    entry = _entry(backend=backend, case=ISA_CASE, known_bug={"link": "https://example.org/isa"} if known else None)
    entry.environment = {**corpus_io.environment("cpu"), "cpu_capability": isa}
    return corpus_io.save(tmp_path, entry, repro=repro)


def _vectorised() -> str:
    """An ISA this CPU runs where ISA_BUG is right: this process's, or AVX2 when this process runs DEFAULT."""
    return "AVX2" if corpus_io.host_isa() == "DEFAULT" else corpus_io.host_isa()


def test_an_entry_recorded_under_another_isa_is_replayed_under_it(tmp_path):
    """A bug found where torch ran DEFAULT still fails when replayed from a process that runs another ISA (in a fresh
    interpreter with ATEN_CPU_CAPABILITY=default), so `pytest corpus` keeps it an expected failure; the same entry
    recorded under a vectorised ISA passes, and is called fixed (the ISA is what decides)."""
    from attnfuzz.cli import replay_outcome
    entry = corpus_io.load(_under_isa(tmp_path / "default", "DEFAULT"))
    verdict = replay_io.replay(entry)
    assert verdict.label == "FAIL:ALL_ZERO" and replay_outcome(entry, verdict) == "xfail", verdict
    if corpus_io.host_isa() != "DEFAULT":
        assert any("ATEN_CPU_CAPABILITY=default" in check for check in verdict.checks), verdict.checks
    fixed = corpus_io.load(_under_isa(tmp_path / "vectorised", _vectorised()))
    verdict = replay_io.replay(fixed)
    assert verdict.status == V.PASS and replay_outcome(fixed, verdict) == "xpass", verdict


def test_an_isa_this_cpu_cannot_run_is_reported_as_such_not_as_fixed(tmp_path):
    """Recorded under an ISA this CPU lacks: replayed here instead; a known bug that passes here is 'recorded on ISA
    X, host runs Y' (skipped), while an entry that is no known bug still guards against a regression here, and a
    known bug that fails here too stays an expected failure."""
    from attnfuzz.cli import replay_outcome
    known = corpus_io.load(_under_isa(tmp_path / "known", "AVX1024", backend="sdpa-math"))   # right here
    verdict = replay_io.replay(known)
    assert verdict.status == V.UNSUPPORTED and replay_outcome(known, verdict) == "skip", verdict
    assert f"recorded on ISA AVX1024, host runs {corpus_io.host_isa()}" in verdict.message, verdict.message
    guard = corpus_io.load(_under_isa(tmp_path / "guard", "AVX1024", known=False, backend="sdpa-math"))
    assert replay_io.replay(guard).status == V.PASS
    broken = corpus_io.load(_under_isa(tmp_path / "broken", "AVX1024", backend="tests.misbehaving:zero_when_causal"))
    assert replay_outcome(broken, replay_io.replay(broken)) == "xfail"


def test_a_cpu_entrys_script_runs_under_the_isa_it_was_recorded_on(tmp_path):
    """The script sets ATEN_CPU_CAPABILITY before torch loads, so a DEFAULT-only bug fails from any shell; a variable
    the user set wins, and the script says the ISA differs from the recorded one."""
    repo = Path(__file__).resolve().parents[1]
    script = _under_isa(tmp_path, "DEFAULT", repro=True).with_suffix(".py")
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["PYTHONPATH"] = str(repo)      # the adapter of a bring-your-own kernel is called through attnfuzz
    bad = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert bad.returncode == 1 and "all-zero output" in bad.stdout and "CPU ISA DEFAULT\n" in bad.stdout, \
        bad.stdout + bad.stderr[-2000:]
    env["ATEN_CPU_CAPABILITY"] = _vectorised().lower()
    ok = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert ok.returncode == 0 and "recorded on DEFAULT, which this run is not" in ok.stdout, ok.stdout + ok.stderr
    source = script.read_text()   # oneDNN is held to the recorded ISA too, only where ATen runs it
    assert 'os.environ.setdefault("ONEDNN_MAX_CPU_ISA", \'SSE41\')' in source
    assert 'if os.environ["ATEN_CPU_CAPABILITY"] == RECORDED_ISA.lower():' in source


def test_standing_in_for_an_older_cpu_holds_onednn_to_its_isa_too():
    """oneDNN picks its ISA from the CPU, not from ATEN_CPU_CAPABILITY: below AVX-512 it is held there as well (a
    variable the caller set wins), and an AVX-512 stand-in leaves it alone."""
    assert emulating("AVX2", {"PATH": "/bin"}) == {"PATH": "/bin", "ATEN_CPU_CAPABILITY": "avx2",
                                                  "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert emulating("default", {})["ONEDNN_MAX_CPU_ISA"] == "SSE41"
    assert emulating("avx2", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"})["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE"
    assert "ONEDNN_MAX_CPU_ISA" not in emulating("avx512", {})


CPUINFO = Path("/proc/cpuinfo")


@pytest.mark.skipif(not (CPUINFO.exists() and "amx_bf16" in CPUINFO.read_text()),
                    reason="needs a CPU with AMX: where oneDNN's own ISA and ATen's part")
def test_an_avx2_stand_in_on_an_amx_cpu_runs_the_cpu_flash_kernel_in_bf16():
    """On a CPU with AMX, ATEN_CPU_CAPABILITY=avx2 alone sent torch's CPU flash attention down oneDNN's AMX packing,
    which ATen's AVX2 kernels refuse ("pack_vnni2 is only supported when avx512 is supported"); held to AVX2 both
    ways, it runs as on an AVX2-only CPU."""
    code = ("import torch, torch.nn.functional as F\n"
            "from torch.nn.attention import SDPBackend, sdpa_kernel\n"
            "q = torch.randn(1, 1, 64, 8, dtype=torch.bfloat16)\n"
            "with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):\n"
            "    print(F.scaled_dot_product_attention(q, q, q).shape, torch.backends.cpu.get_cpu_capability())\n")
    env = emulating("avx2", {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and "AVX2" in done.stdout, done.stderr[-2000:]
