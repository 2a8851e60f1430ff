"""flex-paged: torch's PagedAttention (flex_attention over a paged cache) on CPU. Its page tables read back to the
case's keys (no kernel involved), a few cases graded through torch's eager flex, adapter bugs planted on purpose are
caught (one found and shrunk by a fuzz run), and the capability rules."""

from __future__ import annotations

import pytest
import torch

from attnfuzz.backends import factories
from attnfuzz.backends.flex.paged import ASSIGN, FlexPaged
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.space import Space

F32 = dict(dtype="float32", d_qk=16, d_v=16)
PAGED = Case(b=3, sq=5, skv=37, h=4, hk=2, seqlens_q=(5, 2, 1), seqlens_kv=(37, 16, 3), page_size=3, seed=4,
             alignment="bottom_right", causal=True, **F32)


def graded(backend, case):
    t = materialize(case)
    return grade(case, t, backend.run(case, t), family=backend.family)


@pytest.mark.parametrize("case", [PAGED, PAGED.replace(spelling=ASSIGN), PAGED.replace(shared_prefix_pages=2)],
                         ids=["page-table", "assign", "shared-prefix"])
def test_the_caches_read_back_through_the_page_table_are_the_cases_keys(case):
    t = materialize(case)
    paged, k_flat, v_flat, kv_len = FlexPaged("cpu").paged_attention(case, t)
    size = paged.page_size
    assert kv_len.tolist() == list(case.lens_kv)
    for n, length in enumerate(case.lens_kv):
        for j in range(length):
            page = int(paged.page_table[n, j // size])
            assert int(paged.physical_to_logical[n, page]) == j // size
            slot = page * size + j % size
            assert torch.equal(k_flat[0, :, slot], t.k[n, j]) and torch.equal(v_flat[0, :, slot], t.v[n, j])


@pytest.mark.parametrize("case", [
    PAGED,
    PAGED.replace(spelling=ASSIGN, softcap=5.0, causal=False, window=(4, 1)),
    PAGED.replace(shared_prefix_pages=2, seqlens_kv=(37, 16, 20), mask_density=0.6),
    PAGED.replace(seqlens_kv=(37, 0, 3), alibi_slopes=(0.5, 0.25, 0.125, 0.0625), dtype="bfloat16"),
    Case(b=2, sq=1, skv=40, h=4, hk=1, seqlens_kv=(40, 9), page_size=16, seed=2, **F32),
], ids=["causal", "assign-window-softcap", "shared-prefix-mask", "empty-cache-alibi-bf16", "decode-mqa"])
def test_cases_pass_through_torch_flex(case):
    backend = FlexPaged("cpu")
    assert backend.unsupported(case) is None, backend.unsupported(case)
    assert graded(backend, case).status == V.PASS


class ReadsOnePast(FlexPaged):
    """Planted: hands PagedAttention kv_len + 1, so each sequence reads one slot past its cache (garbage)."""

    def paged_attention(self, case, t):
        paged, k_flat, v_flat, kv_len = super().paged_attention(case, t)
        return paged, k_flat, v_flat, kv_len + 1


class SwapsPages(FlexPaged):
    """Planted: physical_to_logical of each sequence's first two pages swapped (a page-order bug)."""

    def paged_attention(self, case, t):
        paged, k_flat, v_flat, kv_len = super().paged_attention(case, t)
        for n in range(case.b):
            a, b = paged.page_table[n, :2].tolist()
            if a >= 0 and b >= 0 and a != b:
                paged.physical_to_logical[n, a], paged.physical_to_logical[n, b] = 1, 0
        return paged, k_flat, v_flat, kv_len


@pytest.mark.parametrize("planted", [ReadsOnePast, SwapsPages])
def test_planted_adapter_bugs_are_caught(planted):
    case = PAGED.replace(causal=False, alignment="top_left")
    assert graded(FlexPaged("cpu"), case).status == V.PASS
    assert graded(planted("cpu"), case).status == V.FAIL


def test_a_fuzz_run_finds_and_shrinks_a_read_past_the_cache():
    _, findings = fuzz(ReadsOnePast("cpu"), space=Space(max_len=24, max_heads=2, max_head_dim=16),
                       settings=profile("ci", max_examples=60))
    assert findings, "a read one slot past each cache was not found"
    case = findings[0].case
    assert case.paged and case.b == 1 and case.sq == 1 and case.skv <= 2, case


@pytest.mark.parametrize("case, reason", [
    (PAGED.replace(page_size=None), "needs page_size"),
    (PAGED.replace(softmax="learnable"), "no sink term"),
    (PAGED.replace(layout="thd"), "not packed"),
    (PAGED.replace(shared_prefix_pages=1, spelling=ASSIGN), "spelling='assign'"),
])
def test_capability_refusals(case, reason):
    refused = factories()["flex-paged"]("cpu").unsupported(case)
    assert refused is not None and reason in refused, refused
