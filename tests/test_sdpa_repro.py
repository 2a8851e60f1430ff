"""SDPA repro scripts spell every SDPA spelling and layout out: no attnfuzz import, right call passes, broken fails."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from attnfuzz.store import corpus as corpus_io
from attnfuzz.backends import get
from attnfuzz.backends.sdpa.spelling import all_spellings
from attnfuzz.store.repro import script
from attnfuzz.oracles.verdict import Verdict
from attnfuzz.strategies.case import Case
from tests.test_repro_bounds import without_attnfuzz

CASES = [Case(sq=3, skv=5, h=2, hk=1, d_qk=8, d_v=8, causal=True, alignment="bottom_right", layout="sbhd", grads=True),
         Case(sq=4, skv=4, h=2, hk=2, d_qk=8, d_v=8, alibi_slopes=(0.5, 0.25), dtype="float32"),
         Case(sq=4, skv=4, h=2, hk=2, d_qk=8, d_v=8, causal=True)]
# the mask and GQA spellings; the mask forms, explicit scale and module calls (tens of spellings per case, a process
# each) are written out in test_a_mask_form_and_a_module_call_are_written_out below
SPELLED = [(c.replace(spelling=s.name)) for c in CASES for s in all_spellings(c)
           if not (s.form or s.scale or s.module or s.mask == "float32_mask")]


@pytest.mark.parametrize("case", SPELLED, ids=[f"{c.spelling or 'plain'}-{c.layout}" for c in SPELLED])
def test_every_sdpa_spelling_is_written_out(case):
    backend = get("sdpa-math")
    if backend.unsupported(case):
        pytest.skip(backend.unsupported(case))
    source = script(corpus_io.Entry("sdpa-math", case, Verdict("FAIL", "TOLERANCE")))
    assert "fuzz." not in source and "strategies" not in source and "oracles" not in source
    ok = subprocess.run([sys.executable, "-I", "-c", source], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = source.replace("return out.transpose(1, 2)", "return 0.5 * out.transpose(1, 2)")
    bad = subprocess.run([sys.executable, "-I", "-c", broken], capture_output=True, text=True)
    assert bad.returncode == 1 and "> bound" in bad.stdout, bad.stdout + bad.stderr


FORMS = [Case(b=2, sq=4, skv=6, h=2, hk=2, d_qk=8, d_v=8, window=(1, 1), alibi_slopes=(0.5, 0.25), dtype="float16",
              grads=True, spelling="float32_mask+mask_expanded+explicit_scale"),
         Case(sq=4, skv=6, h=2, hk=1, d_qk=8, d_v=8, window=(1, 1), spelling="bool_mask+mask_transposed+enable_gqa"),
         Case(b=2, sq=5, skv=5, h=2, hk=2, d_qk=8, d_v=8, causal=True, dtype="bfloat16",
              spelling="is_causal+mha_batch_first"),
         Case(b=2, sq=4, skv=6, h=2, hk=2, d_qk=8, d_v=8, seqlens_kv=(6, 3), layout="sbhd", grads=True,
              spelling="no_mask+key_padding_mask+mha_seq_first")]


@pytest.mark.parametrize("case", FORMS, ids=[c.spelling for c in FORMS])
@pytest.mark.parametrize("name", ["sdpa-math", "sdpa-flash"])
def test_a_mask_form_and_a_module_call_are_written_out(name, case):
    """The script spells the form (the mask's shape, strides and dtype; the explicit scale; the module) as run()
    does: it passes; the same script with the form undone in a way that changes the answer fails."""
    backend = get(name)
    assert backend.unsupported(case) is None, backend.unsupported(case)
    source = script(corpus_io.Entry(name, case, Verdict("FAIL", "TOLERANCE")))
    assert "fuzz." not in source and "strategies" not in source and "oracles" not in source
    if "mha" in case.spelling:
        assert "torch.nn.MultiheadAttention(" in source and "need_weights=False" in source
        broken = source.replace("mha.out_proj.bias.zero_()", "mha.out_proj.bias.fill_(0.5)")
    else:
        form = case.spelling.split("+")[1]
        assert {"mask_expanded": ".expand(", "mask_transposed": ".transpose(-1, -2)"}[form] in source
        broken = source.replace("mask = mask[", "mask = mask.flip(-1)[").replace(
            "mask = mask.transpose(-1, -2).contiguous()", "mask = mask.flip(-1).transpose(-1, -2).contiguous()")
    assert broken != source
    ok = subprocess.run([sys.executable, "-I", "-c", source], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "-I", "-c", broken], capture_output=True, text=True)
    assert bad.returncode == 1 and "> bound" in bad.stdout, bad.stdout + bad.stderr


def test_a_mask_too_large_to_inline_is_rebuilt_from_the_seed(tmp_path):
    """A dense mask over MASK_INLINE elements is not written out (sq = skv = 11,905 would be 900 MB of source): the
    script rebuilds it from the seed, as it does the inputs of such a case, and still tells the right call from a
    broken one."""
    from attnfuzz.backends.source import MASK_INLINE
    from attnfuzz.backends.sdpa.spelling import dense_mask, parse, regenerated_mask
    from attnfuzz.strategies.materialize import materialize, torch_dtype
    case = Case(sq=1040, skv=1040, h=1, hk=1, d_qk=8, d_v=8, causal=True, alignment="bottom_right",
                dtype="float32", spelling="bool_mask")
    assert case.sq * case.skv > MASK_INLINE
    source = script(corpus_io.Entry("sdpa-math", case, Verdict("FAIL", "TOLERANCE")))
    assert len(source) < 2_000_000 and "regenerated_mask(CASE, 'bool_mask')" in source
    want = dense_mask(case, materialize(case, "cpu"), parse(case), torch_dtype(case), "cpu")
    assert torch.equal(regenerated_mask(case.to_dict(), "bool_mask"), want)
    _tells_right_from_broken(tmp_path, source, "return out.transpose(1, 2)")
    alone = without_attnfuzz(tmp_path / "right.py")   # where attnfuzz cannot be imported: 2, not 1 (the bug is there)
    assert alone.returncode == 2 and "cannot run this repro here" in alone.stderr, alone.stdout + alone.stderr


def _tells_right_from_broken(tmp_path, source: str, returned: str) -> None:
    """The script exits 0 as written and 1 with `returned` (its call's return line) halved."""
    right, broken = tmp_path / "right.py", tmp_path / "broken.py"
    right.write_text(source)
    broken.write_text(source.replace(returned, returned.replace("return ", "return 0.5 * ")))
    ok = subprocess.run([sys.executable, str(right)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, str(broken)], capture_output=True, text=True)
    assert bad.returncode == 1 and "> bound" in bad.stdout, bad.stdout + bad.stderr


def test_a_module_call_mask_too_large_to_inline_is_rebuilt_from_the_seed(tmp_path):
    """The same for the attn_mask handed to nn.MultiheadAttention."""
    from attnfuzz.backends.sdpa.modules import module_masks, regenerated_module_mask
    from attnfuzz.backends.sdpa.spelling import parse
    from attnfuzz.strategies.materialize import materialize, torch_dtype
    case = Case(sq=1040, skv=1040, h=1, hk=1, d_qk=8, d_v=8, causal=True, alignment="bottom_right",
                dtype="float32", spelling="bool_mask+mha_batch_first")
    source = script(corpus_io.Entry("sdpa-math", case, Verdict("FAIL", "TOLERANCE")))
    assert len(source) < 2_000_000
    assert "regenerated_module_mask(CASE, 'bool_mask+mha_batch_first', 'attn_mask')" in source
    want = module_masks(case, materialize(case, "cpu"), parse(case), torch_dtype(case), "cpu")["attn_mask"]
    got = regenerated_module_mask(case.to_dict(), "bool_mask+mha_batch_first", "attn_mask")
    assert torch.equal(got, want)
    returned = next(line.strip() for line in source.splitlines() if line.strip().startswith("return out"))
    _tells_right_from_broken(tmp_path, source, returned)
