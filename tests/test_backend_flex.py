"""The flex_attention adapters on CPU: flex-eager over every mask, score mod and spelling plus random cases;
flex-compiled's graphs (one reused for other values and shapes, static ones for thd and explicit masks) through a
compiler of the tests' own, not inductor; refusals with reasons; the LSE base; and the compiled-or-not report (each
detector with a negative control)."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from attnfuzz.backends.flex import adapter as flex
from attnfuzz.backends.flex import mods
from attnfuzz.backends import get
from attnfuzz.backends.base import Unsupported
from attnfuzz.engine.harness import cases_for
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import Oracle, grade
from attnfuzz.oracles.verdict import Output
from attnfuzz.store.corpus import known_bugs
from attnfuzz.store.known import mark_known
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.space import Space

# torch's own bugs that the shipped corpus records (flex-eager with BACKEND="FLASH" returns a base-2 LSE on torch
# 2.13): KNOWN here, as in a user's run. These tests check the adapter, not that the host's torch is right.
SHIPPED = known_bugs(Path(__file__).resolve().parents[1] / "corpus")

warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
GQA = dict(h=4, hk=2)

# (case, run every spelling): each new structure costs flex's eager path a trace (~0.3 s), so the spelling product
# runs on the cases that have both spelling axes or a mask of each kind.
CASES = [
    (Case(), False),
    (Case(sq=1, skv=1), False),
    (Case(sq=12, skv=20, causal=True), True),
    (Case(sq=20, skv=12, causal=True, alignment="bottom_right"), False),             # rows that see no key
    (Case(sq=16, skv=24, window=(3, 2), dtype="bfloat16", **GQA), True),
    (Case(sq=10, skv=14, window=(None, 2), alignment="bottom_right", dtype="float16"), False),
    (Case(b=2, sq=16, skv=16, seqlens_q=(5, 16), seqlens_kv=(16, 0), causal=True), False),
    (Case(b=2, sq=12, skv=20, h=2, seqlens_q=(12, 3), seqlens_kv=(7, 20), window=(2, 1), alignment="bottom_right",
          alibi_slopes=(0.5, 0.25), softcap=5.0), True),
    (Case(sq=16, skv=16, mask_density=0.5, alibi_slopes=(0.5,)), True),
    (Case(sq=16, skv=20, layout="sbhd", memory="transposed", softcap=0.5, **GQA), False),
    (Case(sq=16, skv=16, memory="expanded_kv", dtype="float16", **GQA), False),
    (Case(sq=8, skv=12, d_qk=16, d_v=8, dtype="float64", scale=0.7), False),
    (Case(b=3, sq=16, skv=16, seqlens_q=(5, 16, 0), seqlens_kv=(16, 0, 3), layout="thd"), False),   # documents
    (Case(b=3, sq=16, skv=20, seqlens_q=(5, 16, 2), seqlens_kv=(16, 4, 20), layout="thd", causal=True,
          alignment="bottom_right", dtype="bfloat16", **GQA), True),
    (Case(b=2, sq=12, skv=12, h=2, seqlens_q=(7, 12), seqlens_kv=(12, 9), layout="thd", window=(2, 1),
          mask_density=0.6, alibi_slopes=(0.5, 0.125), softcap=5.0), False),
]


def graded(backend, case: Case):
    tensors = materialize(case)
    output = backend.run(case, tensors)
    oracle = Oracle.of(case, tensors)
    return tensors, output, oracle, grade(case, tensors, output, family=backend.family, oracle=oracle)


@pytest.mark.slow
def test_eager_every_feature_and_spelling_passes():
    backend = get("flex-eager", "cpu")
    passed, failures, spellings = 0, [], set()
    for case, every_spelling in CASES:
        assert backend.unsupported(case) is None, (case, backend.unsupported(case))
        for spelling in backend.spellings(case) if every_spelling else ("",):
            spelled = case.replace(spelling=spelling)
            _, output, _, verdict = graded(backend, spelled)
            verdict = mark_known(SHIPPED, backend.name, spelled, verdict)
            spellings.update(spelling.split("+"))
            assert output.lse is not None and output.ran.startswith("flex_attention eager"), output.ran
            if verdict.status in (V.PASS, V.KNOWN):
                passed += 1
            else:
                failures.append(f"{verdict.label} {verdict.message[:300]}\n  {spelled!r}")
    assert not failures, "\n".join(failures)
    assert passed >= 20 and {"", "score_mask", "repeat_kv"} <= spellings, (passed, spellings)


@pytest.mark.slow
def test_eager_random_cases_never_fail():
    backend = get("flex-eager", "cpu")
    space = Space(max_batch=2, max_len=32, max_heads=4, max_head_dim=32)
    seen: Counter = Counter()
    failures = []

    @settings(max_examples=30, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases_for(backend, space))
    def check(case):
        if backend.unsupported(case) is not None:
            seen["UNSUPPORTED"] += 1
            return
        verdict = mark_known(SHIPPED, backend.name, case, graded(backend, case)[3])
        seen[verdict.label] += 1
        if verdict.status not in (V.PASS, V.KNOWN):
            failures.append(f"{verdict.label} {verdict.message[:300]}\n  {case!r}")

    check()
    assert not failures, "\n".join(failures[:5])
    assert seen["PASS"] + seen["KNOWN:LSE"] >= 24 and seen["PASS"] >= 18, seen


def test_lse_is_natural_log_and_really_graded():
    case = Case(sq=12, skv=20, causal=True, **GQA)
    tensors, output, oracle, verdict = graded(get("flex-eager", "cpu"), case)
    assert verdict.status == V.PASS and output.lse is not None, verdict.message
    in_log2 = Output(out=output.out, lse=output.lse / math.log(2))
    assert grade(case, tensors, in_log2, oracle=oracle).label == "FAIL:LSE"


@pytest.mark.parametrize("name, case, expected", [
    ("flex-eager", Case(softmax="off_by_one"), "no sink"),
    ("flex-compiled", Case(softmax="learnable"), "no sink"),
    ("flex-eager", Case(b=2, seqlens_q=(3, 8), seqlens_kv=(0, 0), layout="thd"), "no key at all"),
    ("flex-compiled", Case(b=2, seqlens_q=(0, 0), seqlens_kv=(3, 8), layout="thd"), "no query at all"),
    ("flex-eager", Case(grads=True), "no backward"),
    ("flex-compiled", Case(grads=True), "no backward"),
    ("flex-compiled", Case(dtype="float64"), "float32 / float16 / bfloat16 only"),
    ("flex-eager", Case(spelling="score_mask"), "not one of flex-eager's spellings"),
    ("flex-eager", Case(causal=True, spelling="repeat_kv"), "spellings"),
])
def test_refusals_name_their_reason(name, case, expected):
    backend = compiled() if name == "flex-compiled" else get(name, "cpu")   # the rules, whatever this CPU's ISA
    reason = backend.unsupported(case)
    assert reason is not None and expected in reason, reason


def test_spellings_follow_the_case():
    backend = get("flex-eager", "cpu")

    def shaped(case):  # the mask and heads spellings, without the BACKEND knobs eager adds to each
        return tuple(s for s in backend.spellings(case) if not set(s.split("+")) & {"triton", "decode", "flash"})
    assert backend.spellings(Case()) == ("", "triton", "decode", "flash")
    assert shaped(Case(causal=True)) == ("", "score_mask")
    assert shaped(Case(**GQA)) == ("", "repeat_kv")
    assert set(shaped(Case(window=(1, 1), **GQA))) == {"", "repeat_kv", "score_mask", "score_mask+repeat_kv"}
    assert shaped(Case(alibi_slopes=(0.5,))) == ("",)      # ALiBi is a score mod, not a mask


def test_mods_carry_their_parameters_in_their_names():
    off = torch.zeros(2, dtype=torch.long)
    assert mods.band_left(torch.tensor(3), off).__name__ == "band_left(3)"
    both = mods.all_of(mods.band_left(torch.tensor(3), off), mods.band_right(torch.tensor(0), off))
    assert both.__name__ == "band_left(3) & band_right(0)"
    assert mods.softcap(torch.tensor(30.0)).__name__ == "softcap(30)"
    assert mods.padding(torch.tensor([3, 4]), torch.tensor([5, 6])).__name__ == "padding(q=[3, 4], kv=[5, 6])"


def test_mask_mods_follow_the_documented_index_arithmetic():
    """query i sees key j iff i + off - left <= j <= i + off + right, per batch row: checked against a dense grid."""
    off = torch.tensor([0, 3])
    mod = mods.all_of(mods.band_left(torch.tensor(2), off), mods.band_right(torch.tensor(1), off),
                      mods.padding(torch.tensor([4, 5]), torch.tensor([6, 7])))
    b, i, j = torch.meshgrid(torch.arange(2), torch.arange(5), torch.arange(8), indexing="ij")
    want = (j >= i + off[b] - 2) & (j <= i + off[b] + 1) & (i < torch.tensor([4, 5])[b]) & (j < torch.tensor([6, 7])[b])
    assert torch.equal(mod(b, torch.zeros_like(b), i, j), want)


# -- compiled ----------------------------------------------------------------------------------------------------------
# The compiled adapter's logic (a graph per structural variant, lengths dynamic, the mods' parameters handed in as
# inputs, sizes pinned where inductor needs it, refusals, the compiled-or-not report) is checked through a
# torch.compile backend of the tests' own, which keeps each graph dynamo hands it and runs it as traced (flex's own
# math, as flex-eager): never through inductor's kernels, whose answers depend on the host's vector ISA. Those are
# fuzzed (pytest fuzz, flex-compiled) and what they get wrong is in corpus/ (flex-compiled-FAIL-*).
EVERY_MOD = dict(b=2, h=2, hk=2, d_qk=16, d_v=16, window=(3, 1), alignment="bottom_right", softcap=5.0,
                 alibi_slopes=(0.5, 0.25))


def recording_compiler():
    """A torch.compile backend that records the FX graphs it is given (in .graphs) and runs each as traced."""
    def recorder(gm, example_inputs):
        recorder.graphs.append(gm)
        return gm.forward
    recorder.graphs = []
    return recorder


def compiled(compiler=None) -> flex.FlexBackend:
    """flex-compiled on CPU, compiling through `compiler` (a fresh recording one by default), with dynamo's state as
    in a fresh process: what earlier compiles of the same call saw (sizes that varied) would change its first graph."""
    import torch._dynamo
    torch._dynamo.reset()
    return flex.FlexBackend("cpu", compiled=True, compiler=compiler or recording_compiler())


def inputs(gm) -> dict:
    """A recorded graph's inputs: placeholder name -> its example value (a fake tensor, or a SymInt)."""
    return {n.name: n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"}


def test_compiled_one_variant_serves_other_values_and_shapes():
    """Band, padding, softcap and ALiBi at once; the band, lengths, slopes and shapes change, the graph does not
    (an explicit mask is pinned to its shape: see flex._pin_static): two graphs, a static one and one with dynamic
    lengths, and each case's output graded against the float64 oracle, so a value baked into the graph fails."""
    backend = compiled()
    cases = [Case(sq=16, skv=24, seqlens_q=(16, 5), seqlens_kv=(20, 24), seed=1, **EVERY_MOD),
             Case(sq=20, skv=12, seqlens_q=(20, 9), seqlens_kv=(12, 3), seed=2, **EVERY_MOD),
             Case(sq=33, skv=7, seqlens_q=(2, 33), seqlens_kv=(7, 0), seed=3,
                  **{**EVERY_MOD, "window": (0, 5), "alibi_slopes": (0.125, 1.0), "softcap": 0.5})]
    assert len({flex._variant_key(case) for case in cases}) == 1
    ran = []
    for case in cases:
        _, output, _, verdict = graded(backend, case)
        assert verdict.status == V.PASS, f"{verdict.label} {verdict.message}\n  {case!r}"
        assert output.lse is None                       # compiled flex on CPU returns none
        ran.append(output.ran)
    assert all(r.startswith("flex_attention compiled by recorder (") for r in ran), ran
    assert backend.variants == {flex._variant_key(cases[0]): 3}, backend.variants
    assert [r.split("(")[1].split(";")[0] for r in ran] == ["new graph", "new graph", "cached graph"], ran
    assert len(backend.compiler.graphs) == backend.graphs == 2, ran
    static, dynamic = (inputs(gm) for gm in backend.compiler.graphs)
    assert not any(isinstance(x, torch.SymInt) for x in static.values()), static
    q = next(x for x in dynamic.values() if isinstance(x, torch.Tensor) and x.dim() == 4)      # q comes first
    assert isinstance(q.shape[2], torch.SymInt) and q.shape[:2] == (2, 2), q.shape   # lengths dynamic, batch pinned
    parameters = [x for x in dynamic.values() if isinstance(x, torch.Tensor) and x.dim() <= 1]
    assert len(parameters) >= 6, dynamic          # bounds, offsets, lengths, softcap, slopes: inputs, not constants
    assert all(isinstance(n, int) for x in parameters for n in x.shape), parameters  # pinned (flex._pin_static)


def test_a_bound_baked_into_the_graph_costs_a_graph_per_value(monkeypatch):
    """Negative control for the test above: a band whose bound is a Python int (a constant to dynamo, guarded on)
    compiles a new graph for the third case's window, and the graph count says so."""
    monkeypatch.setattr(mods, "band_left", lambda left, off: mods._named(
        lambda b, h, q_idx, kv_idx, bound=int(left): kv_idx >= q_idx + off[b] - bound, "baked"))
    backend = compiled()
    for case in (Case(sq=16, skv=24, seqlens_q=(16, 5), seqlens_kv=(20, 24), seed=1, **EVERY_MOD),
                 Case(sq=20, skv=12, seqlens_q=(20, 9), seqlens_kv=(12, 3), seed=2, **EVERY_MOD),
                 Case(sq=20, skv=12, seqlens_q=(20, 9), seqlens_kv=(12, 3), seed=2, **{**EVERY_MOD, "window": (0, 1)})):
        assert graded(backend, case)[3].status == V.PASS
    assert len(backend.compiler.graphs) == backend.graphs == 3


def test_compiled_packed_low_precision_gqa():
    """Document masking (thd) and an explicit mask in bf16 with GQA K/V repeated, compiled with static sizes: a
    graph per shape (flex._pin_static says why)."""
    backend = compiled()
    case = Case(b=3, sq=24, skv=40, seqlens_q=(24, 3, 0), seqlens_kv=(17, 40, 5), layout="thd", causal=True,
                alignment="bottom_right", dtype="bfloat16", mask_density=0.7, **GQA)
    for each in (case, case.replace(seqlens_q=(24, 9, 1), seed=1)):
        _, output, _, verdict = graded(backend, each.replace(spelling="repeat_kv"))
        assert verdict.status == V.PASS and "compiled by recorder" in output.ran, (verdict.message, output.ran)
    assert len(backend.compiler.graphs) == 2
    assert not any(isinstance(x, torch.SymInt) for gm in backend.compiler.graphs for x in inputs(gm).values())


def test_an_eager_fallback_is_reported_not_hidden():
    """Negative control for the compiled check: the same call run outside torch.compile says so."""
    backend = compiled()
    backend._compiled_calls = {False: flex._flex_call}     # what dynamo would run if it fell back to eager
    case = Case(causal=True)
    output = backend.run(case, materialize(case))
    assert "NOT compiled" in output.ran and not backend.compiler.graphs, output.ran


def test_hitting_the_recompile_limit_is_unsupported_not_a_silent_eager_run(monkeypatch):
    backend = compiled()
    first = Case(sq=16, skv=24, seqlens_q=(16, 5), seqlens_kv=(20, 24), seed=1, **EVERY_MOD)
    backend.run(first, materialize(first))                 # one graph exists
    monkeypatch.setattr(flex, "RECOMPILE_LIMIT", 1)
    other = Case(sq=8, skv=8, h=3, hk=1, d_qk=8, d_v=8, window=(2, None), dtype="float16")  # a new variant
    with pytest.raises(Unsupported, match="recompile limit"):
        backend.run(other, materialize(other))


def test_inductor_on_a_cpu_without_its_flex_template_is_unavailable_not_a_crash(monkeypatch):
    """Inductor lowers flex_attention on CPU only with AVX2 or better: under ATEN_CPU_CAPABILITY=default torch
    raises NotImplementedError on every case, so the adapter says so once (torch's own rule, which reads the
    variable at compile time). A compiler that needs no template is not refused."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    why = flex.FlexBackend("cpu", compiled=True).available()
    assert why is not None and "AVX2" in why and "'default'" in why, why
    assert compiled().available() is None and flex.FlexBackend("cpu", compiled=False).available() is None
    assert flex.FlexBackend("cpu", compiled=True).unsupported(Case()) == why


@pytest.mark.parametrize("case", [
    Case(causal=True, h=4, hk=2, grads=True, spelling="score_mask+repeat_kv"),
    Case(b=2, sq=12, skv=20, seqlens_q=(12, 3), seqlens_kv=(7, 20), layout="sbhd", window=(2, 1),
         alibi_slopes=(0.5,), softcap=5.0, grads=True),
    Case(b=3, sq=16, skv=20, seqlens_q=(5, 16, 2), seqlens_kv=(16, 4, 20), layout="thd", causal=True,
         alignment="bottom_right", h=4, hk=2, memory="expanded_kv", grads=True),
    Case(sq=16, skv=16, mask_density=0.5, memory="transposed", dtype="bfloat16", grads=True),
], ids=["gqa-score-mask", "sbhd-padded-band-mods", "thd-expanded-kv", "transposed-bf16"])
def test_gradient_plumbing_with_torchs_cpu_guard_lifted(monkeypatch, case):
    """flex refuses backward on CPU (so the adapter refuses grads there); with that guard lifted, its dense math
    backward runs and checks the adapter's gradient plumbing (leaves per layout, dout, back to logical shapes)
    before a GPU ever sees it."""
    import torch.nn.attention.flex_attention as fa
    monkeypatch.setattr(fa, "_validate_device", lambda *args, **kwargs: None)
    tensors, output, _, verdict = graded(get("flex-eager", "cpu"), case)
    assert verdict.status == V.PASS and output.dq is not None, f"{verdict.label} {verdict.message}"
    assert output.dk.shape == tensors.k.shape and output.dv.shape == tensors.v.shape


def test_compiled_flex_refuses_small_head_dims_on_cuda_only():
    """Found on an H200: compiled flex on CUDA raises NYI below head dim 16; CPU compiles them."""
    cuda = flex.FlexBackend("cuda", compiled=True)
    cuda.available = lambda: None                       # the rule, not this machine's lack of a GPU
    assert "head dims >= 16" in cuda.unsupported(Case(d_qk=8, d_v=8))
    assert cuda.unsupported(Case(d_qk=16, d_v=16)) is None
    assert compiled().unsupported(Case(d_qk=8, d_v=8)) is None
