"""Per-tensor storage (Case.storage, strategies/materialize.py): the same values in the buffers each class says,
NaN in the unused elements, omitted from a case's JSON at its default; a plain run draws every class on every tensor;
kernels with a bug only a storage reaches (tests/layout_kernels.py) are found and shrunk to the plainest case of the
class, and the same kernel without the bug never fails; a finding's repro script rebuilds the buffers."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter

import pytest
import torch
from hypothesis import given

from attnfuzz.backends.custom import load_custom
from attnfuzz.engine.harness import fuzz, run_case
from attnfuzz.engine.profiles import profile
from attnfuzz.store import corpus as corpus_io
from attnfuzz.tools.shrink import shrink
from attnfuzz.strategies.case import STORAGES, Case
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.materialize import draw_on_cpu, materialize
from attnfuzz.strategies.space import Space

BASE = Case(b=2, sq=5, skv=7, h=4, hk=2, d_qk=8, d_v=4, dtype="bfloat16")


@pytest.mark.parametrize("memory", ["contiguous", "transposed", "expanded_kv"])
@pytest.mark.parametrize("kind", STORAGES[1:])
def test_a_storage_holds_the_same_values_in_its_own_buffer(memory, kind):
    case = BASE.replace(memory=memory, storage=("plain", kind, kind))
    plain, t = draw_on_cpu(BASE.replace(memory=memory)), materialize(case)
    assert t.q is not None and t.q.stride() == plain.q.stride() and t.q.storage_offset() == 0   # q stays plain
    for name in ("k", "v"):
        x, p = getattr(t, name), getattr(plain, name)
        assert torch.equal(x, p), name
        buffer = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
        if kind == "offset":
            assert x.storage_offset() == 1 and x.stride() == p.stride() and buffer[0].isnan()
        else:
            assert x.stride(-1) == (2 if kind == "strided" else 1) and not x.is_contiguous()
        distinct = math.prod(n for n, s in zip(x.shape, x.stride()) if s != 0)   # elements x addresses
        assert buffer.numel() - int(buffer.isnan().sum()) == distinct and buffer.numel() > distinct   # NaN elsewhere
        if memory == "expanded_kv":
            assert x.stride(2) == 0                                                     # still one KV head, stride 0


def test_storage_is_omitted_at_its_default_and_checked():
    assert "storage" not in BASE.to_dict()
    case = BASE.replace(storage=("plain", "offset", "plain"))
    assert case.to_dict()["storage"] == ["plain", "offset", "plain"] and Case.from_json(case.to_json()) == case
    for bad, fix in (((("plain", "nope", "plain"),), "three of"), (("offset",), "three of")):
        with pytest.raises(ValueError, match=f"storage.*{fix}"):
            BASE.replace(storage=bad[0])
    with pytest.raises(ValueError, match="storage other than plain is for bshd"):
        BASE.replace(layout="sbhd", storage=("offset", "plain", "plain"))
    with pytest.raises(ValueError, match="the first is 'plain'"):
        Space(storages=("offset",))


def test_a_plain_run_draws_every_storage_on_every_tensor_and_the_switch_turns_them_off():
    seen: Counter = Counter()

    @profile("ci", max_examples=1000)
    @given(case=attention_cases(Space(max_len=80)))
    def draw(case):
        seen.update((i, kind) for i, kind in enumerate(case.storage))
        seen["any"] += case.storage != ("plain",) * 3

    draw()
    assert {(i, kind) for i in range(3) for kind in STORAGES} <= set(seen), seen
    assert 0.01 <= seen["any"] / 1000 <= 0.1, seen["any"]                       # a small share (1 bshd case in 6)
    seen.clear()

    @profile("ci", max_examples=200)
    @given(case=attention_cases(Space(storages=("plain",))))
    def off(case):
        seen[case.storage] += 1

    off()
    assert set(seen) == {("plain",) * 3}, seen


# kernel in tests/layout_kernels.py -> the storage classes of K it breaks on
PLANTED = {"gapless_k": ("padded_rows", "strided"), "k_from_buffer_start": ("offset",)}
SPACE = Space(max_len=80)
SETTINGS = profile("ci", max_examples=1000)


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_bug_only_a_storage_reaches_is_found_and_shrunk_to_its_plainest_case(name, tmp_path):
    tally, findings = fuzz(load_custom(f"tests.layout_kernels:{name}", "cpu"), space=SPACE, settings=SETTINGS)
    assert findings, f"{name}: nothing found in {tally.to_dict()}"
    assert all(f.case.storage[1] in PLANTED[name] for f in findings), [f.case for f in findings]
    smallest = min(findings, key=lambda f: (f.case.sq + f.case.skv, f.case.b, f.case.h)).case
    # q and v plain, one query, one key (a padded row needs two keys to leave a gap), one batch and head
    assert smallest.storage[0] == smallest.storage[2] == "plain", smallest
    assert (smallest.b, smallest.h, smallest.sq) == (1, 1, 1) and smallest.skv <= 2, smallest
    assert smallest.memory == "contiguous" and smallest.values in ("gaussian", "probe"), smallest
    # the finding's repro script rebuilds the buffers: it fails on the buggy kernel and passes on the correct one
    entry = corpus_io.Entry(backend=f"tests.layout_kernels:{name}", case=smallest,
                            verdict=next(f.verdict for f in findings if f.case == smallest), device="cpu")
    path = corpus_io.save(tmp_path, entry).with_suffix(".py")
    bad = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr[-2000:]
    path.write_text(path.read_text().replace(f"tests.layout_kernels:{name}", "tests.layout_kernels:correct"))
    good = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stdout + good.stderr[-2000:]


def test_the_same_kernel_without_the_bug_never_fails():
    tally, findings = fuzz(load_custom("tests.layout_kernels:correct", "cpu"), space=SPACE, settings=SETTINGS)
    assert not findings, [f"{f.verdict.label} {f.verdict.message[:300]} {f.case!r}" for f in findings]
    assert tally.labels["PASS"] == SETTINGS.max_examples, tally.to_dict()


def test_attnfuzz_shrink_walks_a_storage_finding_to_the_one_buffer_the_bug_needs():
    backend = load_custom("tests.layout_kernels:k_from_buffer_start", "cpu")
    big = Case(b=2, sq=9, skv=12, h=4, hk=2, d_qk=16, d_v=8, memory="transposed", seed=3,
               storage=("strided", "offset", "padded_rows"))

    def fails(case):
        verdict = run_case(backend, case)
        return verdict if verdict.failed else None

    small, verdict, _ = shrink(big, fails)
    assert small.storage == ("plain", "offset", "plain") and small.memory == "contiguous", small
    assert (small.b, small.sq, small.skv, small.h) == (1, 1, 1, 1) and verdict.failed, small
    assert shrink(big, lambda case: None)[0] == big   # control: nothing fails, nothing changes
