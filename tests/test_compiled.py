"""Compile-aware search (strategies/compiled.py): the compile keys adapters declare, the share of cases drawn inside
compiled configurations, and a planted bug in one configuration found and shrunk as plain search finds it."""

from __future__ import annotations

import io

import pytest

from attnfuzz.backends.base import Backend
from attnfuzz.backends.flash.fa4 import FlashAttn4
from attnfuzz.backends.flashinfer.adapter import SingleDecode, SinglePrefill
from attnfuzz.backends.flex.adapter import FlexBackend
from attnfuzz.engine.compiled_search import FROM_BUILD_FAILURE, BuildFailures, compiled_configs, declares_compile_key
from attnfuzz.engine.harness import cases_for, fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.engine.warm import main as warm_main, plainest, warm
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.compiled import CompiledConfigs, pin
from attnfuzz.strategies.space import Space
from bench.jit_fake import FakeJit, Verdicts, buggy

BASE = Case(b=2, sq=64, skv=64, h=4, hk=2, d_qk=64, d_v=64, dtype="bfloat16")


def _runtime_variants(case: Case) -> list[Case]:
    """The same kernel configuration at other lengths, batch, heads (same group), seed and values."""
    return [case.replace(sq=17, skv=130), case.replace(b=1), case.replace(h=8, hk=4), case.replace(seed=7),
            case.replace(values="probe"), case.replace(std=(4.0, 4.0, 1.0))]


def _structural_variants(case: Case) -> list[Case]:
    return [case.replace(dtype="float16"), case.replace(d_qk=128, d_v=128), case.replace(softcap=30.0),
            case.replace(window=(8, None)), case.replace(causal=True)]


@pytest.mark.parametrize("backend", [FlashAttn4(device="cpu", arch=90), SinglePrefill(device="cpu"),
                                     FlexBackend("cpu", compiled=True)], ids=lambda b: b.name)
def test_compile_key_separates_structure_and_not_runtime(backend):
    case = BASE.replace(b=1) if backend.name.startswith("flashinfer") else BASE
    key = backend.compile_key(case)
    assert key is not None
    runtime = [c for c in _runtime_variants(case) if not (backend.name.startswith("flashinfer") and c.b != 1)]
    if backend.name == "flex-compiled":  # flex's graph is per head count and (static) batch
        runtime = [c for c in runtime if (c.h, c.hk, c.b) == (case.h, case.hk, case.b)]
    assert runtime and all(backend.compile_key(c) == key for c in runtime)
    for other in _structural_variants(case):
        if backend.name.startswith("flashinfer") and other.causal:
            continue  # causal is a mask mode dispatched inside one FlashInfer module
        assert backend.compile_key(other) != key, other


def test_fa4_key_follows_gqa_group_sinks_route_and_backward():
    fa4 = FlashAttn4(device="cpu", arch=90)
    key = fa4.compile_key(BASE)
    assert fa4.compile_key(BASE.replace(h=8, hk=2)) != key                     # another GQA group size
    assert fa4.compile_key(BASE.replace(softmax="learnable")) != key           # learnable_sink present
    assert fa4.compile_key(BASE.replace(layout="thd", seqlens_q=(64, 3), seqlens_kv=(64, 9))) != key   # varlen
    assert fa4.compile_key(BASE.replace(grads=True)) != key
    assert fa4.compile_key(BASE.replace(window=(3, None))) == fa4.compile_key(BASE.replace(window=(40, None)))


def test_flashinfer_key_ignores_what_one_module_dispatches():
    decode = SingleDecode(device="cpu")
    case = BASE.replace(b=1, sq=1, alignment="bottom_right")
    assert decode.compile_key(case) == decode.compile_key(case.replace(h=8, hk=1, skv=900))
    assert decode.compile_key(case) != SinglePrefill(device="cpu").compile_key(case)   # another JIT module


def test_backends_without_compilation_keep_the_plain_strategy():
    eager = FlexBackend("cpu", compiled=False)
    assert eager.compile_key(BASE) is None
    assert not declares_compile_key(Backend()) and declares_compile_key(FakeJit())
    assert type(cases_for(Backend())).__name__ != "_CompileAware"
    assert type(cases_for(FakeJit(), Space(compiled_share=0))).__name__ != "_CompileAware"
    assert type(cases_for(FakeJit())).__name__ == "_CompileAware"
    with pytest.raises(ValueError, match="compiled_share"):
        Space(compiled_share=1.0)


def test_pin_keeps_the_key_and_takes_runtime_fields():
    backend = FakeJit()
    pinned = Case(d_qk=64, d_v=64, dtype="bfloat16", causal=True, softcap=5.0, h=4, hk=2)
    drawn = Case(b=3, sq=40, skv=90, h=6, hk=3, d_qk=8, d_v=8, dtype="float16", seed=99, softcap=30.0)
    key = backend.compile_key(pinned)
    case = pin(pinned, drawn, key, lambda c, k: backend.unsupported(c) is None and backend.compile_key(c) == k,
               Space().max_work)
    assert backend.compile_key(case) == key
    assert (case.b, case.sq, case.skv, case.seed, case.softcap) == (3, 40, 90, 99, 30.0)
    assert (case.hk, case.h) == (3, 6)   # drawn KV heads at the configuration's group size (2)


# The streams a test that needs a failure tries, in order. Which stream meets a rare planted configuration within a
# budget is an accident of the strategy's choices (any change to the case strategy moves it); what these tests hold
# is what the search does with a failure once it meets one, so each takes the first stream of these that meets it,
# and fails where none does.
SEEDS = range(6)


def _first_stream(search):
    """`search(seed)` -> (met, result) for each of SEEDS in turn: the first result that met a failure."""
    for seed in SEEDS:
        met, result = search(seed)
        if met:
            return result
    raise AssertionError(f"none of the streams {list(SEEDS)} met a failure: nothing to shrink")


def _met(result):
    """(met, result) for _first_stream, of a result whose last item is the search's findings."""
    return bool(result[-1]), result


def _search(bug: str, share: float, seed: int, examples: int = 300):
    backend = FakeJit(bug=bug)
    keys = []
    _, findings = fuzz(backend, space=Space(compiled_share=share), seed=seed, worker=Verdicts(backend), reruns=0,
                       on_case=lambda case, verdict, tally: keys.append(backend.compile_key(case))
                       if verdict.status != V.UNSUPPORTED else None,
                       settings=profile("quick", max_examples=examples, database=None))
    return keys, findings


def test_search_stays_inside_compiled_configurations_at_its_share():
    keys, findings = _search("none", 0.8, seed=3)
    assert not findings
    seen, inside = set(), 0
    for key in keys:
        inside += key in seen
        seen.add(key)
    plain_keys, _ = _search("none", 0.0, seed=3)
    plain_inside = len(plain_keys) - len(set(plain_keys))
    # 0.8 of draws are pinned (every one inside), some fresh ones meet a compiled key too; plain search rarely does
    assert inside / len(keys) >= 0.7, (inside, len(keys))
    assert plain_inside / len(plain_keys) < 0.5, (plain_inside, len(plain_keys))
    assert len(set(keys)) < len(set(plain_keys))


MINIMAL = Case(sq=1, skv=1, d_qk=8, d_v=8, dtype="bfloat16", causal=True, softcap=5.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_planted_bug_in_a_configuration_is_found_and_shrunk_as_before(seed):
    """Compile-aware search finds the bug in a rare configuration, and its finding ends at the minimal case (a draw
    pinned to a compiled configuration keeps its fields under Hypothesis's shrink: the harness walks them on). Compile-aware
    search gets as many fresh draws as plain search (the same compile time on a JIT backend): with as many examples
    it meets a rare configuration about a fifth as often, and whether it does depends on the stream."""
    plain = _search("config", 0.0, seed)[1]
    aware = _search("config", 0.8, seed, examples=1500)[1]
    assert [f.verdict.label for f in plain] == ["FAIL:TOLERANCE"] == [f.verdict.label for f in aware]
    # the harness finishes a compile-aware finding's shrink (finish_shrinking), the softcap's value too
    assert aware[0].case == MINIMAL, aware[0].case
    found = plain[0].case   # plain search's own shrink stops short on some streams (values='probe', layout='sbhd')
    assert (found.sq, found.skv, found.d_qk, found.dtype, found.causal, found.softcap) == (1, 1, 8, "bfloat16", True,
                                                                                           5.0), found


def test_planted_bug_past_the_first_case_of_its_configuration_is_found():
    """Past 64 keys only: the configuration's first case may pass and a pinned draw find the bug; its shrink then
    is finished outside them, down to the fewest keys that fail (65). Compile-aware search gets the examples that give
    it as many fresh draws as plain search at 300 (the same compile time on a JIT backend); whether plain search meets
    this class in 300 depends on the stream, so it is not compared here."""
    aware = _first_stream(lambda seed: _met(_search("config-long", 0.8, seed, examples=1500)[1]))
    assert [f.verdict.label for f in aware] == ["FAIL:TOLERANCE"]
    assert buggy(aware[0].case, "config-long") and aware[0].case.skv == 65, aware[0].case


def test_negative_control_correct_backend_has_no_finding():
    assert _search("none", 0.8, seed=0, examples=150)[1] == []


def test_configurations_are_numbered_in_order_and_choices_keep_their_meaning():
    configs = CompiledConfigs()
    assert configs.named(5) is None                  # nothing compiled: a fresh draw, for good
    configs.add(("a",), BASE)
    configs.add(("b",), BASE.replace(dtype="float16"))
    assert not configs.add(("a",), BASE.replace(seed=3))
    assert (configs.named(0), configs.named(3), configs.named(5)) == (0, 1, None)
    configs.add(("c",), BASE.replace(d_qk=32, d_v=32))
    assert configs.named(3) == 1 and configs.named(4) == 1 and configs.named(2) == 2
    assert compiled_configs(FakeJit()) is not compiled_configs(FakeJit())


def test_warm_up_compiles_each_plainest_configuration_once():
    backend = FakeJit()
    cases = plainest(backend)
    keys = [backend.compile_key(c) for c in cases]
    assert len(cases) >= 8 and len(set(keys)) == len(keys)
    assert all(backend.unsupported(c) is None for c in cases)
    assert {c.dtype for c in cases} == {"float16", "bfloat16"} and cases[0].causal is False
    assert warm(backend, "cpu", out=io.StringIO()) == len(cases) and len(backend.compiled) == len(cases)


def test_warm_up_names_a_bad_backend(capsys):
    assert warm_main(["no-such-backend", "cpu"]) == 2
    assert "not a known backend" in capsys.readouterr().err
    assert warm_main([]) == 2


def test_a_campaign_warms_only_the_backends_that_compile(capsys):
    from attnfuzz.campaign.supervisor import warm_jit_backends
    warm_jit_backends({"backends": ["sdpa-math", "fa4"], "device": "cpu"})
    err = capsys.readouterr().err
    assert "warm: fa4: not available here" in err and "sdpa-math" not in err


def _first_failure_then(share: float, closing: bool, monkeypatch) -> tuple[int, int, list]:
    """Configurations compiled by the search before its first failure, and by Hypothesis after it (its shrink and
    what is left of its search; finish_shrinking's are not counted), with the findings, on the first stream that
    meets a failure (_first_stream; closing acts only after the first failure, so the negative control takes the
    same one); `closing` False: the configurations are never closed (the negative control)."""
    if not closing:
        monkeypatch.setattr(CompiledConfigs, "closed", property(lambda self: False, lambda self, value: None),
                            raising=False)
    return _first_stream(lambda seed: _failure_then(share, seed))


def _failure_then(share: float, seed: int):
    backend = FakeJit(bug="config")
    before, after, failed = set(), set(), []

    def on_case(case, verdict, tally):
        if verdict.status == V.UNSUPPORTED:
            return
        key = backend.compile_key(case)
        (after if failed else before).add(key)
        failed.extend([True] if verdict.failed else [])

    _, findings = fuzz(backend, space=Space(max_len=160, compiled_share=share), seed=seed, worker=Verdicts(backend),
                       reruns=0, on_case=on_case, settings=profile("quick", max_examples=300, database=None))
    return bool(failed), (len(before), len(after - before), findings)


def test_after_the_first_failure_hypothesis_compiles_nothing_new(monkeypatch):
    """Once a compile-aware search fails, its configurations are closed: Hypothesis shrinks the failure (and searches
    on) inside the compiled ones, and the finding still ends at the minimal case. Negative control: left open, the
    same stream compiles new configurations after its first failure."""
    found_at, new, findings = _first_failure_then(0.8, True, monkeypatch)
    assert found_at > 0 and new == 0, (found_at, new)
    assert [f.verdict.label for f in findings] == ["FAIL:TOLERANCE"] and findings[0].case == MINIMAL
    assert not compiled_configs(FakeJit()).closed   # (a backend object of its own: open)


def test_negative_control_open_configurations_compile_during_the_shrink(monkeypatch):
    found_at, new, findings = _first_failure_then(0.8, False, monkeypatch)
    assert found_at > 0 and new > 0, (found_at, new)


def test_a_known_bug_leaves_the_configurations_open():
    """A failure the corpus knows is tallied KNOWN and the search goes on past it, still compiling new configurations
    (closing them there would confine a run with the shipped corpus to what it compiled before its first known bug).
    The closing itself fires on an unknown failure (test_after_the_first_failure_hypothesis_compiles_nothing_new)."""
    def search(seed):
        backend = FakeJit(bug="config")
        before, after, known_seen = set(), set(), []

        def on_case(case, verdict, tally):
            if verdict.status != V.UNSUPPORTED:
                (after if known_seen else before).add(backend.compile_key(case))
            known_seen.extend([case] if verdict.status == V.KNOWN else [])

        _, findings = fuzz(backend, space=Space(max_len=160, compiled_share=0.8), seed=seed, worker=Verdicts(backend),
                           reruns=0, on_case=on_case, known=lambda name, case, verdict: {"entry": "planted"},
                           settings=profile("quick", max_examples=300, database=None))
        return bool(known_seen), (backend, before, after, findings)

    backend, before, after, findings = _first_stream(search)
    assert findings == [], findings
    assert not compiled_configs(backend).closed
    assert len(after - before) > 5, (len(before), len(after - before))


def test_a_search_opens_its_configurations_again_when_it_ends():
    backend = FakeJit(bug="config")
    configs = compiled_configs(backend)
    fuzz(backend, space=Space(compiled_share=0.8), seed=0, worker=Verdicts(backend), reruns=0,
         settings=profile("quick", max_examples=300, database=None))
    assert len(configs) > 0 and not configs.closed
    configs.closed = True   # as an interrupted search may leave them: the next search opens them first
    _, findings = fuzz(backend, space=Space(compiled_share=0.8), seed=1, worker=Verdicts(backend), reruns=0,
                       settings=profile("quick", max_examples=50, database=None))
    assert not configs.closed


def _build_search(bug: str, memo: bool, seed: int):
    backend = FakeJit(bug=bug)
    if not memo:
        backend.build_errors = ()   # the backend names no build errors: every case builds for real
    _, findings = fuzz(backend, space=Space(max_len=160, compiled_share=0.8), seed=seed, worker=Verdicts(backend),
                       reruns=0, settings=profile("quick", max_examples=300, database=None))
    return backend, findings


def test_a_shrink_step_of_a_kernel_that_failed_to_build_does_not_build_it_again():
    """FA4 caches only the kernels that build: every shrink step in a configuration that failed to build compiled and
    failed again. While the search shrinks, a case of such a compile key is answered from the first failure; the
    finding is run for real before it is kept, and ends at the same minimal case."""
    # remembering acts only while a failure is shrunk: both searches of a stream meet their first failure alike
    seed, remembered, [found] = _first_stream(lambda seed: _met((seed, *_build_search("build", memo=True, seed=seed))))
    rebuilt, [found_before] = _build_search("build", memo=False, seed=seed)
    assert found.case == found_before.case == MINIMAL, (found.case, found_before.case)
    assert found.verdict.label == "CRASH:CompilerDiagnosticError"
    assert FROM_BUILD_FAILURE not in found.verdict.checks, "the kept verdict is the backend's own"
    assert remembered.failed_builds * 2 < rebuilt.failed_builds, (remembered.failed_builds, rebuilt.failed_builds)


def test_negative_control_a_key_that_misses_what_fails_to_build_still_keeps_a_real_finding(monkeypatch):
    """A compile key that misses what the kernel is built for (here the key tile count: only past 64 keys) makes the
    remembered answer wrong for shorter cases of the key: the finding the shrink settles on then does not fail for
    real, and the smallest case that did is kept instead, never a verdict the backend did not give."""
    settled = []
    settle = BuildFailures.settle

    def watched(self, finding, run):
        kept = settle(self, finding, run)
        settled.append((finding.case, kept.case))
        return kept

    monkeypatch.setattr(BuildFailures, "settle", watched)
    backend, [found] = _first_stream(lambda seed: _met(_build_search("build-long", memo=True, seed=seed)))
    assert [before.skv <= 64 and after.skv > 64 for before, after in settled] == [True], "the answer was wrong"
    assert found.verdict.label == "CRASH:CompilerDiagnosticError" and found.verdict.status == V.CRASH
    assert FROM_BUILD_FAILURE not in found.verdict.checks
    assert Verdicts(backend).run(found.case).label == "CRASH:CompilerDiagnosticError", found.case


def test_build_failures_are_answered_only_while_a_failure_is_shrunk():
    backend = FakeJit(bug="build")
    configs = CompiledConfigs()
    builds = BuildFailures(Verdicts(backend).run, backend, configs)
    case = MINIMAL.replace(sq=3, skv=5)
    assert builds.run(case).status == V.CRASH and backend.failed_builds == 1
    assert builds.run(case.replace(seed=1)).status == V.CRASH and backend.failed_builds == 2, "open: built again"
    configs.closed = True
    answer = builds.run(case.replace(seed=2))
    assert answer.label == "CRASH:CompilerDiagnosticError" and FROM_BUILD_FAILURE in answer.checks
    assert backend.failed_builds == 2 and builds.answered == 1, "closed: answered without building"
    assert builds.run(case.replace(causal=False)).status == V.PASS, "another key builds"


def test_compiled_flex_keys_a_length_of_1_apart():
    """dynamo specializes a length of 1: a graph traced at sq = 1 is traced again at sq = 64, so the two are two keys
    (else pinned draws counted a retrace as a compiled case); other lengths share one."""
    flex = FlexBackend("cpu", compiled=True)
    key = flex.compile_key(BASE)
    assert flex.compile_key(BASE.replace(sq=17, skv=130)) == key
    assert flex.compile_key(BASE.replace(sq=1)) != key and flex.compile_key(BASE.replace(skv=1)) != key
