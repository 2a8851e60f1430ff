"""flex-paged: torch's PagedAttention (flex_attention over a paged cache) on CPU. Its page tables read back to the
case's keys (no kernel involved), a few cases graded through torch's eager flex, adapter bugs planted on purpose are
caught (one found and shrunk by a fuzz run), the capability rules, and the standalone repro scripts (torch only; they
fail once their call reads past a cache)."""

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


@pytest.mark.slow
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


# -- standalone repro scripts -------------------------------------------------------------------------------------
REPRO = {"page-table-shared-prefix-alibi": PAGED.replace(shared_prefix_pages=2, seqlens_kv=(37, 16, 20), causal=False,
                                                         alignment="top_left", alibi_slopes=(0.5, 0.25, 0.125, 0.0625)),
         "assign-window-softcap": PAGED.replace(spelling=ASSIGN, softcap=5.0, causal=False, window=(4, 1)),
         "decode-mqa-mask": Case(b=2, sq=1, skv=40, h=4, hk=1, seqlens_kv=(40, 9), page_size=16, seed=2,
                                 mask_density=0.5, **F32)}
READS_ONE_PAST = ("kv_len = torch.tensor(LENS_KV, device=device)", "kv_len = torch.tensor(LENS_KV, device=device) + 1")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REPRO))
def test_repro_script_runs_alone_and_can_fail(tmp_path, name):
    """The script passes alone (torch only) and fails with its call's output zeroed; where the key one past each
    cache is in every last query's band (the first two cases), also with its call reading that slot (kv_len one
    past each cache: a slot of garbage), which its own check against the float64 answer reports."""
    from tests.test_repro_scripts import assert_standalone_and_able_to_fail, run_alone, write
    case = REPRO[name]
    assert FlexPaged("cpu").unsupported(case) is None
    path = write(tmp_path, "flex-paged", case)
    text = path.read_text()
    assert "PagedAttention" in text and "convert_logical_block_mask" in text and READS_ONE_PAST[0] in text
    assert ("assigned_cache(k, v, LENS_KV" if case.spelling == ASSIGN else "page_table_cache(k, v, BLOCK_TABLE") in text
    assert_standalone_and_able_to_fail(path)
    if case.mask_density is None:
        path.write_text(text.replace(*READS_ONE_PAST))
        failing, _ = run_alone(path)
        assert failing.returncode == 1 and "error > bound" in failing.stdout, failing.stdout + failing.stderr[-3000:]


@pytest.mark.slow
def test_the_written_call_computes_what_run_computes():
    """For cases drawn from flex-paged's strategy, the script's `attention` gives run()'s output bit for bit, over
    both spellings and shared prefix pages."""
    from tests.test_repro_scripts import compared_on_drawn_cases
    cases = compared_on_drawn_cases(FlexPaged("cpu"), lambda: None, 20)
    assert len(cases) >= 15, cases
    assert {case.spelling for case in cases} == {"", ASSIGN}, cases
    assert any(case.shared_prefix_pages for case in cases), cases
