"""The float64 oracle: closed forms, agreement with SDPA in float64, independence, bounded memory."""

from __future__ import annotations

import ast
import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.materialize import draw, materialize, torch_dtype
from attnfuzz.strategies.space import Space
from attnfuzz.oracles.fold import fold
from attnfuzz.oracles.reference import reference

ROOT = Path(__file__).resolve().parents[1]


def test_single_key_returns_its_value_and_lse_is_its_logit():
    case = Case(sq=5, skv=1, h=2, hk=1, d_qk=8, d_v=4, dtype="float64", seed=3)
    t = materialize(case)
    ref = reference(case, t)
    assert torch.equal(ref.out, t.v.expand(1, 5, 2, 4).to(torch.float64))
    logits = torch.einsum("bqhd,bkd->bhq", t.q, t.k[:, :, 0]) * case.softmax_scale
    assert torch.allclose(ref.lse, logits, rtol=0, atol=1e-14)


def test_uniform_scores_average_the_visible_values():
    case = Case(sq=6, skv=6, d_qk=4, d_v=3, dtype="float64", causal=True, std=(0.0, 1.0, 1.0))
    t = materialize(case)
    ref = reference(case, t)
    v = t.v[0, :, 0]
    for i in range(6):
        assert torch.allclose(ref.out[0, i, 0], v[: i + 1].mean(0), atol=1e-15)
        assert ref.lse[0, 0, i].item() == pytest.approx(math.log(i + 1), abs=1e-15)


def test_all_masked_rows_give_zero_and_minus_inf():
    case = Case(sq=4, skv=4, dtype="float64", mask_density=0.0, grads=True)
    ref = reference(case, materialize(case))
    assert torch.equal(ref.out, torch.zeros_like(ref.out))
    assert torch.isneginf(ref.lse).all()
    assert all(torch.equal(g, torch.zeros_like(g)) for g in (ref.dq, ref.dk, ref.dv)), "no NaN leaks into grads"


def test_rows_before_the_bottom_right_diagonal_are_empty():
    case = Case(sq=5, skv=2, dtype="float64", causal=True, alignment="bottom_right")
    ref = reference(case, materialize(case))
    assert torch.isneginf(ref.lse[0, 0, :3]).all() and torch.isfinite(ref.lse[0, 0, 3:]).all()
    assert (ref.out[0, :3] == 0).all()


def test_one_visible_key_per_row_copies_it():
    case = Case(sq=7, skv=7, h=4, hk=2, dtype="float64", window=(0, 0))
    t = materialize(case)
    ref = reference(case, t)
    assert torch.equal(ref.out, t.v.repeat_interleave(2, dim=2).to(torch.float64))


def test_sink_only_rows_have_zero_output_and_the_sink_as_lse():
    case = Case(sq=3, skv=3, h=2, hk=2, dtype="float64", softmax="learnable", mask_density=0.0)
    t = materialize(case)
    ref = reference(case, t)
    assert (ref.out == 0).all()
    assert torch.allclose(ref.lse[0], t.sink.to(torch.float64)[:, None].expand(2, 3))


def test_off_by_one_adds_one_to_the_denominator():
    case = Case(sq=4, skv=4, dtype="float64", softmax="off_by_one")
    t = materialize(case)
    plain = reference(case.replace(softmax="vanilla"), t)
    ref = reference(case, t)
    assert torch.allclose(ref.lse, torch.log1p(plain.lse.exp()), atol=1e-14)
    ratio = plain.lse.exp() / (1 + plain.lse.exp())                       # [b, h, sq]
    assert torch.allclose(ref.out, plain.out * ratio.transpose(1, 2)[..., None], atol=1e-14)


def _sdpa64(case: Case, t, mask=None, is_causal=False):
    q, k, v = (x.transpose(1, 2).detach().requires_grad_() for x in (t.q, t.k, t.v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=case.scale,
                                         enable_gqa=case.h != case.hk)
    out.transpose(1, 2).backward(t.dout)
    return out.transpose(1, 2), q.grad.transpose(1, 2), k.grad.transpose(1, 2), v.grad.transpose(1, 2)


@pytest.mark.parametrize("case", [
    Case(b=2, sq=37, skv=53, h=6, hk=2, d_qk=24, d_v=16, dtype="float64", causal=True, grads=True, seed=1),
    Case(b=1, sq=64, skv=64, h=4, hk=1, d_qk=32, d_v=32, dtype="float64", causal=True, grads=True, seed=2),
    Case(b=3, sq=20, skv=9, h=2, hk=2, d_qk=8, d_v=12, dtype="float64", grads=True, scale=0.3, seed=4),
], ids=["gqa-causal-top-left", "mqa-causal", "custom-scale"])
def test_agrees_with_sdpa_in_float64(case):
    t = materialize(case)
    ref = reference(case, t)
    got = _sdpa64(case, t, is_causal=case.causal)
    for name, mine, theirs in zip(("out", "dq", "dk", "dv"), (ref.out, ref.dq, ref.dk, ref.dv), got):
        assert (mine - theirs).abs().max().item() < 1e-12, name


def test_agrees_with_sdpa_boolean_mask_in_float64():
    case = Case(b=2, sq=30, skv=41, h=4, hk=2, d_qk=16, d_v=16, dtype="float64", mask_density=0.7, grads=True)
    t = materialize(case)
    ref = reference(case, t)
    out, dq, dk, dv = _sdpa64(case, t, mask=t.mask)
    keep = t.mask.any(-1).transpose(1, 2)[..., None]  # SDPA's fully-masked rows are its own convention
    assert (torch.where(keep, ref.out - out, 0)).abs().max().item() < 1e-12
    for mine, theirs in ((ref.dk, dk), (ref.dv, dv)):
        assert (mine - theirs).abs().max().item() < 1e-12


def test_lse_agrees_with_cpu_flash_in_float64():
    case = Case(b=2, sq=33, skv=33, h=2, hk=2, d_qk=16, d_v=16, dtype="float64", causal=True)
    t = materialize(case)
    q, k, v = (x.transpose(1, 2).contiguous() for x in (t.q, t.k, t.v))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True)[:2]
    ref = reference(case, t)
    assert (ref.lse - lse).abs().max().item() < 1e-12
    assert (ref.out - out.transpose(1, 2)).abs().max().item() < 1e-12


def test_chunking_does_not_change_the_result():
    case = Case(b=2, sq=50, skv=70, h=4, hk=2, dtype="float64", seqlens_q=(50, 31), seqlens_kv=(70, 12),
                alignment="bottom_right", window=(5, 3), grads=True)
    t = materialize(case)
    whole, tiny = reference(case, t), reference(case, t, chunk_bytes=1)
    for name in ("out", "lse", "dq", "dk", "dv"):
        assert torch.allclose(getattr(whole, name), getattr(tiny, name), atol=1e-13, rtol=0), name


def _peak_growth_mib(n: int, chunk_mib: int) -> int:
    """How far the oracle of an n x n causal bf16 head raises a fresh process's resident memory at its peak, in MiB:
    the peak is restarted just before the call (/proc/self/clear_refs), so neither importing torch's peak nor pages
    the kernel reclaimed since then can hide it."""
    code = ("from attnfuzz.strategies.case import Case\nfrom attnfuzz.strategies.materialize import materialize\n"
            "from attnfuzz.oracles.reference import reference\n"
            "def status(key):\n"
            "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(key + ':'))\n"
            f"c = Case(sq={n}, skv={n}, d_qk=8, d_v=8, dtype='bfloat16', causal=True)\n"
            "t = materialize(c)\nopen('/proc/self/clear_refs', 'w').write('5')\nbase = status('VmRSS')\n"
            f"reference(c, t, chunk_bytes={chunk_mib} * 2**20)\n"
            "print((status('VmHWM') - base) // 1024)")
    return int(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip())


@pytest.mark.parametrize("n, chunk_mib, limit_mib", [
    (4096, 8, 128),                                                    # unchunked: 128 MiB of float64 scores, ~550 peak
    pytest.param(16384, 32, 600, marks=pytest.mark.long),             # 2 GiB unchunked: the README's figure
], ids=["4k", "16k"])
def test_memory_stays_bounded_on_a_long_head(n, chunk_mib, limit_mib):
    """n x n scores take n * n * 8 bytes in float64 unchunked; the chunked oracle stays far below."""
    grown_mib = _peak_growth_mib(n, chunk_mib)
    assert grown_mib < limit_mib, f"peak memory grew by {grown_mib} MiB"


def test_control_an_unchunked_head_is_what_the_memory_bound_catches():
    """Negative control for the bound above: the same 4k head in one chunk raises the peak far above the chunked
    run's (about 550 MiB against 60). Measured from a peak restarted just before the oracle: against ru_maxrss, a
    long test session's subprocess had a peak before the oracle high enough to hide most of it (86 MiB of growth
    read there, 601 in a fresh session)."""
    unchunked, chunked = _peak_growth_mib(4096, 1024), _peak_growth_mib(4096, 8)
    assert unchunked > max(2 * chunked, chunked + 64), (unchunked, chunked)


FORBIDDEN_NAMES = {"softmax", "log_softmax", "_safe_softmax", "scaled_dot_product_attention", "flex_attention",
                   "DotProductAttention", "functional"}
FORBIDDEN_PARTS = ("scaled_dot_product", "flash_attn", "transformer_engine", "sdpa", "fuzz")


def independence_violations(source: str) -> list[str]:
    """What in `source` would make the oracle depend on an attention backend."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for name in filter(None, names):
                root = ".".join(name.split(".")[:2]) if name.startswith("attnfuzz.") else name.split(".")[0]
                if root not in ALLOWED_IMPORTS or name.startswith(("torch.nn", "torch.ops")):
                    found.append(f"imports {name}")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "case":
            continue  # a field of the case language, e.g. case.softmax
        if isinstance(node, (ast.Attribute, ast.Name)):
            word = node.attr if isinstance(node, ast.Attribute) else node.id
            if word in FORBIDDEN_NAMES or any(part in word for part in FORBIDDEN_PARTS):
                found.append(f"uses {word}")
    return found


ALLOWED_IMPORTS = {"torch", "math", "dataclasses", "functools", "__future__", "attnfuzz.oracles", "attnfuzz.strategies", "typing"}


def test_oracle_calls_no_attention_backend():
    """Independence: oracles/ imports only torch, the standard library and the case language, and names no
    attention API (not even torch.softmax: the softmax is written out)."""
    for path in (ROOT / "oracles").glob("*.py"):
        assert independence_violations(path.read_text()) == [], path.name


@pytest.mark.parametrize("bad", ["import torch.nn.functional as F", "from torch.nn.attention import sdpa_kernel",
                                 "out = torch.softmax(s, -1)", "from flash_attn import flash_attn_func",
                                 "y = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)",
                                 "from attnfuzz.backends import get"])
def test_independence_check_fires(bad):
    assert independence_violations(bad), bad


FOLD_SPACE = Space(max_len=48, max_work=2**18)


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(case=attention_cases(FOLD_SPACE))
def test_a_folded_batch_gives_what_one_sequence_at_a_time_gives(case):
    """The batch folded into the heads (oracles/fold.py) is the same reference, field by field: the float64 one to
    1e-12, the dtype's and the fp32 baselines to their own rounding (a GEMM over more heads may block differently)."""
    t = draw(case, "cpu")
    fused = None if case.dtype == "float32" else torch_dtype(case)
    baselines = [dict(), dict(dtype=torch_dtype(case), terms=False, grads=False),
                 dict(dtype=torch.float32, terms=False, rounding=fused)]
    for options in baselines:
        folded, apart = reference(case, t, **options), reference(case, t, fold_batch=False, **options)
        exact = options.get("dtype", torch.float64) == torch.float64
        for field in dataclasses.fields(folded):
            a, b = getattr(folded, field.name), getattr(apart, field.name)
            for name, x in (a.items() if isinstance(a, dict) else [("", a)]):
                y = b[name] if name else b
                if isinstance(x, torch.Tensor):
                    assert x.shape == y.shape and x.dtype == y.dtype, (field.name, name)
                    # float64 sums taken in another order (a GEMM over more heads, or on more threads, blocks
                    # differently) differ by a few ulps of their terms, not of a sum that cancels to near 0
                    scale = float(y.double().nan_to_num(0.0, 0.0, 0.0).abs().max()) if y.numel() else 0.0
                    atol = 1e-12 * scale if exact else 1e-6
                    assert torch.allclose(x.double(), y.double(), rtol=1e-12 if exact else 1e-4, atol=atol,
                                          equal_nan=True), (field.name, name, case)
                else:
                    assert x == y or math.isclose(x, y, rel_tol=1e-12), (field.name, x, y)


def test_only_a_batch_of_whole_unmasked_sequences_is_folded():
    whole = Case(b=3, sq=5, skv=7, h=4, hk=2, d_qk=8, d_v=8, alibi_slopes=(0.5, 0.25, 0.125, 0.0625))
    one, tensors = fold(whole, materialize(whole))
    assert (one.b, one.h, one.hk, len(one.alibi_slopes)) == (1, 12, 6, 12) and tensors.q.shape == (1, 5, 12, 8)
    assert fold(whole.replace(b=1, alibi_slopes=(0.5, 0.25, 0.125, 0.0625)), materialize(whole.replace(b=1))) is None
    padded = whole.replace(seqlens_q=(5, 2, 5), seqlens_kv=(7, 7, 7))
    assert fold(padded, materialize(padded)) is None
    masked = whole.replace(mask_density=0.5)
    assert fold(masked, materialize(masked)) is None
