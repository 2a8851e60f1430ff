"""flex-compiled's kernel-option spellings (fuzz/backends/flex/knobs.py): which are offered for which case on the CPU
and on a CUDA device described to the rules (no GPU needed), the kernel_options each passes, that they run and pass
through the harness, that a repro script carries them, and negative controls: a kernel that does what the option
tells it, given the option where the rules refuse it, is caught as FAIL."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.attention.flex_attention as fa
from hypothesis import HealthCheck, given, settings

from attnfuzz.backends.flex import adapter as flex
from attnfuzz.backends.flex import knobs
from attnfuzz.engine.harness import run_case
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.reference import reference
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.space import Space
from tests.test_repro_scripts import assert_standalone_and_able_to_fail, write

warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
GQA = dict(h=4, hk=2)
EVERY_KNOB = set(knobs.KNOBS)


class CudaRules(flex.FlexBackend):
    """flex-compiled with its knob rules read for a CUDA device of `arch` (FA4 installed or not), run on the CPU: the
    rules need no GPU, and inductor's CPU template ignores the options, so a run checks what reaches torch."""

    def __init__(self, compiler="inductor", arch: int = 90, flash: bool = True, eager_call: bool = False):
        super().__init__("cpu", compiled=True, compiler=compiler, arch=arch)
        self.flash, self.eager_call = flash, eager_call

    def knob_refusal(self, name, case, parts=()):
        return knobs.knob_refusal(name, case, parts, device_type="cuda", arch=self._arch, flash_installed=self.flash)

    def _call(self, case, args):
        if self.eager_call:  # flex_attention as called, no graph: what a patched flex_attention sees is the call
            out, lse, _ = flex._flex_call(*args)
            return out, lse, "flex_attention called eagerly (test)"
        return super()._call(case, args)


def knobs_of(backend, case: Case) -> set[str]:
    return {p for s in backend.spellings(case) for p in s.split("+") if p in knobs.KNOBS}


CUDA_CASE = dict(sq=16, skv=16, d_qk=32, d_v=32, dtype="float16")


def cuda_case(**changes) -> Case:
    """A case every knob's CUDA rules can take (head dims >= 16, fp16), with `changes`."""
    return Case(**{**CUDA_CASE, **changes})


@pytest.mark.parametrize("case, offered", [
    (cuda_case(causal=True), EVERY_KNOB),
    (cuda_case(softcap=5.0), EVERY_KNOB - {"prescale"}),
    (cuda_case(alibi_slopes=(0.5,)), EVERY_KNOB - {"prescale"}),
    (cuda_case(b=2, seqlens_q=(16, 3), seqlens_kv=(16, 16)), EVERY_KNOB - {"rows_safe"}),   # padding rows
    (cuda_case(sq=20, skv=12, causal=True, alignment="bottom_right"), EVERY_KNOB - {"rows_safe"}),
    (cuda_case(sq=127), EVERY_KNOB),
    (cuda_case(sq=128), EVERY_KNOB - {"decode"}),
    (cuda_case(b=2, sq=70, layout="thd", seqlens_q=(70, 60), seqlens_kv=(16, 16)),
     EVERY_KNOB - {"decode"}),                                                   # 130 packed query rows
    (cuda_case(dtype="float32"), EVERY_KNOB - {"flash"}),
    (cuda_case(d_qk=20, d_v=20), EVERY_KNOB - {"flash"}),       # FA4: multiples of 8
    (cuda_case(grads=True), EVERY_KNOB - {"flash"}),
])
def test_cuda_knobs_follow_the_case(case, offered):
    assert knobs_of(CudaRules(), case) == offered


def test_no_knob_compiled_on_cpu_eager_takes_backend_alone_and_flash_needs_sm90_and_fa4():
    case = cuda_case(causal=True)
    assert knobs_of(flex.FlexBackend("cpu", compiled=True), case) == set()
    assert knobs_of(flex.FlexBackend("cpu", compiled=False), case) == {"triton", "decode", "flash"}
    assert knobs_of(flex.FlexBackend("cuda", compiled=False, arch=80), cuda_case(sq=500)) == {"triton", "decode",
                                                                                               "flash"}
    assert "BACKEND" in flex.FlexBackend("cpu", compiled=False).knob_refusal("prescale", case)
    assert "flash" not in knobs_of(CudaRules(arch=80), case)
    assert "flash" not in knobs_of(CudaRules(flash=False), case)
    assert "flash" in knobs_of(CudaRules(arch=100), case)


def test_decode_takes_a_power_of_two_group_only():
    """h // hk = 3: the decode kernel is refused with enable_gqa, offered once KV is repeated (group 1)."""
    spellings = CudaRules().spellings(cuda_case(h=6, hk=2))
    assert "decode" not in spellings and "repeat_kv+decode" in spellings


@pytest.mark.parametrize("case, spelling, needles", [
    (cuda_case(softcap=5.0), "prescale", ("PRESCALE_QK", "softcap")),
    (cuda_case(b=2, seqlens_q=(16, 3), seqlens_kv=(16, 16)), "rows_safe", ("ROWS_GUARANTEED_SAFE", "13 row")),
    (cuda_case(sq=128), "decode", ("TRITON_DECODE", "128 query rows")),
    (cuda_case(h=6, hk=2), "decode", ("power of two",)),
    (cuda_case(dtype="float32"), "flash", ("BACKEND='FLASH'", "float32")),
    (cuda_case(causal=True), "turbo", ("not one of",)),
])
def test_a_refused_knob_names_its_rule(case, spelling, needles):
    backend = CudaRules()
    reason = backend.unsupported(case.replace(spelling=spelling))
    assert reason is not None and all(n in reason for n in needles), reason


def test_cpu_refuses_a_knob_spelling_naming_why():
    reason = flex.FlexBackend("cpu", compiled=True).unsupported(cuda_case(causal=True, spelling="rows_safe"))
    assert reason is not None and "CPU flex template ignores" in reason, reason


@settings(max_examples=80, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=attention_cases(Space(max_batch=3, max_len=12, max_heads=2, max_head_dim=8)))
def test_empty_rows_are_the_rows_the_oracle_finds_empty(case):
    """rows_safe's rule against the float64 oracle: the rows it counts are the oracle's empty rows, plus, batched,
    the padding rows past each sequence (flex computes them, the padding mask hides every key from them)."""
    ref = reference(case, materialize(case), terms=False)
    padding_rows = 0 if case.layout == "thd" else sum(case.sq - n for n in case.lens_q)
    assert knobs.empty_rows(case) == int(ref.empty.sum()) + padding_rows


def test_empty_rows_covers_cases_with_and_without():
    assert knobs.empty_rows(Case(sq=20, skv=12, causal=True, alignment="bottom_right")) == 8
    assert knobs.empty_rows(Case(sq=8, skv=8, mask_density=0.0)) == 8
    assert knobs.empty_rows(Case(sq=8, skv=8, window=(2, 0))) == 0


def recording_flex(monkeypatch) -> list:
    """flex_attention patched to record the kernel_options of each call (and run as before)."""
    seen, real = [], fa.flex_attention

    def recorded(*args, kernel_options=None, **kwargs):
        seen.append(kernel_options)
        return real(*args, kernel_options=kernel_options, **kwargs)
    monkeypatch.setattr(fa, "flex_attention", recorded)
    return seen


@pytest.mark.parametrize("spelling, options", [
    ("", None),
    ("prescale", {"PRESCALE_QK": True}),
    ("rows_safe", {"ROWS_GUARANTEED_SAFE": True}),
    ("triton", {"BACKEND": "TRITON"}),
    ("decode", {"BACKEND": "TRITON_DECODE"}),
    ("tiles32", {"BACKEND": "TRITON", "fwd_BLOCK_M": 32, "fwd_BLOCK_N": 32}),
    ("flash", {"BACKEND": "FLASH"}),
    ("score_mask+repeat_kv+triton", {"BACKEND": "TRITON"}),
])
def test_each_spelling_passes_its_kernel_options(monkeypatch, spelling, options):
    seen = recording_flex(monkeypatch)
    case = cuda_case(causal=True, spelling=spelling, **GQA)
    CudaRules(eager_call=True).run(case, materialize(case))
    assert seen == [options]


def test_the_compile_key_tells_knobs_apart():
    backend, case = CudaRules(), cuda_case(causal=True, **GQA)
    spellings = backend.spellings(case)
    assert len({backend.compile_key(case.replace(spelling=s)) for s in spellings}) == len(spellings) == 28


@pytest.mark.slow
@pytest.mark.parametrize("case", [
    cuda_case(sq=12, skv=20, causal=True, seed=1, **GQA),
    cuda_case(b=3, sq=16, skv=20, seqlens_q=(5, 16, 2), seqlens_kv=(16, 4, 20), layout="thd", causal=True, seed=2,
              alignment="bottom_right", dtype="bfloat16"),
])
def test_knob_spellings_run_and_pass_through_inductor_on_cpu(case):
    """Every spelling torch is handed on CUDA, through inductor on the CPU and the harness: torch's own option checks
    take them (BACKEND's values, fwd_ prefixes), the compiled call runs, and the oracle passes it. The CPU template
    ignores the options, so this checks the plumbing; the kernels they select are fuzzed on a GPU."""
    import torch._dynamo
    torch._dynamo.reset()
    backend = CudaRules()
    if backend.available():
        pytest.skip(backend.available())
    spellings = [s for s in backend.spellings(case) if s in knobs.KNOBS]   # a compile each: the knobs alone
    assert set(spellings) >= EVERY_KNOB - {"rows_safe"}   # the thd case has empty rows
    verdicts = {s: run_case(backend, case.replace(spelling=s)) for s in spellings}
    assert all(v.status == V.PASS for v in verdicts.values()), {s: v for s, v in verdicts.items()
                                                                if v.status != V.PASS}


@pytest.mark.slow
def test_the_repro_script_passes_the_kernel_options(tmp_path):
    case = Case(sq=16, skv=16, causal=True, dtype="float32", seed=1, spelling="tiles32", d_qk=16, d_v=16)
    path = write(tmp_path, "flex-compiled", case)
    assert "kernel_options={'BACKEND': 'TRITON', 'fwd_BLOCK_M': 32, 'fwd_BLOCK_N': 32}" in path.read_text()
    assert_standalone_and_able_to_fail(path, fake="compile")


# -- negative controls: a kernel that does what the option tells it, given the option where the rules refuse it ------
def misbehaving_flex(monkeypatch) -> None:
    """flex_attention doing what two options tell a kernel: ROWS_GUARANTEED_SAFE drops the guard for a row whose
    maximum is -inf, so such a row gets exp2(-inf - -inf) = NaN; PRESCALE_QK hands the score_mod
    scale * log2(e) * q.k and takes exp2 of what it returns, i.e. exp(ln 2 * score_mod(log2(e) * s))."""
    real = fa.flex_attention

    def kernel(q, k, v, score_mod=None, kernel_options=None, return_aux=None, **kwargs):
        options = kernel_options or {}
        if options.get("PRESCALE_QK"):
            inner = score_mod or (lambda s, b, h, i, j: s)

            def score_mod(s, b, h, i, j):
                return inner(s * math.log2(math.e), b, h, i, j) * math.log(2)
        out, aux = real(q, k, v, score_mod=score_mod, return_aux=fa.AuxRequest(lse=True), **kwargs)
        if options.get("ROWS_GUARANTEED_SAFE"):
            out = out.masked_fill(torch.isinf(aux.lse)[..., None], float("nan"))
        return (out, aux) if return_aux is not None else out
    monkeypatch.setattr(fa, "flex_attention", kernel)


class Lax(CudaRules):
    """Offers every knob on every case: the rules this module tests, left out."""

    def knob_refusal(self, name, case, parts=()):
        return None


@pytest.mark.parametrize("case, spelling", [
    (cuda_case(sq=20, skv=12, causal=True, alignment="bottom_right", dtype="float32"), "rows_safe"),
    (cuda_case(b=2, seqlens_q=(16, 16), seqlens_kv=(16, 0), dtype="float32"), "rows_safe"),
    (cuda_case(softcap=2.0, dtype="float32"), "prescale"),
    (cuda_case(alibi_slopes=(1.0,), dtype="float32"), "prescale"),
])
def test_a_knob_where_its_rule_refuses_it_is_caught(monkeypatch, case, spelling):
    """The rules refuse the knob for the case; a backend without them runs it on the kernel that honours the option
    and FAILs; with the rules the same kernel passes that knob where it is offered (the fake is only wrong where the
    option's promise or its score_mod condition breaks)."""
    misbehaving_flex(monkeypatch)
    case = case.replace(spelling=spelling)
    assert CudaRules().unsupported(case) is not None
    verdict = run_case(Lax(eager_call=True), case)
    assert verdict.status == V.FAIL, verdict
    fine = cuda_case(causal=True, seed=3, dtype="float32").replace(spelling=spelling)
    assert CudaRules().unsupported(fine) is None
    assert run_case(CudaRules(eager_call=True), fine).status == V.PASS
