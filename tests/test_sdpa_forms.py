"""The argument forms SDPA's input checks accept beyond the documented ones, and nn.MultiheadAttention's call of it:
every form graded on CPU (sdpa-math, sdpa-flash) passes, the kernel that refuses one says why, and a planted kernel
or adapter that gets a form wrong (a mask broadcast over the wrong dimension, strides ignored, a float32 mask read
as boolean, an explicit scale mishandled, MultiheadAttention's masks misread) fails."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnfuzz.backends import get
from attnfuzz.backends.sdpa import modules
from attnfuzz.backends.sdpa import spelling as sdpa_spelling
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import Oracle, grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize

CPU_KERNELS = ("sdpa-math", "sdpa-flash")
NEW = {"float32_mask", "explicit_scale", "key_padding_mask", "mha_batch_first", "mha_seq_first",
       *sdpa_spelling.FORMS}
CASES = [
    Case(sq=8, skv=8, h=2, hk=2, causal=True, dtype="float16"),                          # square causal: every form
    Case(sq=6, skv=10, h=2, hk=2, window=(2, 1), dtype="bfloat16", grads=True),          # band, same per sequence
    Case(b=2, sq=8, skv=12, h=2, hk=2, seqlens_kv=(5, 12), dtype="float16", grads=True),  # key padding only
    Case(b=2, sq=8, skv=8, h=2, hk=2, seqlens_q=(8, 5), seqlens_kv=(6, 8), causal=True, layout="sbhd"),
    Case(b=2, sq=6, skv=9, h=4, hk=2, window=(2, 1), alibi_slopes=(0.5, 0.25, 0.1, 0.05), layout="sbhd",
         grads=True),                                                                    # a mask per sequence and head
    Case(sq=5, skv=7, h=2, hk=2, mask_density=0.6, d_qk=16, d_v=8, memory="transposed"),  # flash refuses d_qk != d_v
]


def graded(backend, case: Case):
    tensors = materialize(case)
    output = backend.run(case, tensors)
    return output, grade(case, tensors, output, family=backend.family, oracle=Oracle.of(case, tensors))


def new_spellings(backend, case: Case) -> list[str]:
    return [s for s in backend.spellings(case) if NEW & set(s.split("+"))]


@pytest.mark.parametrize("name", CPU_KERNELS)
def test_every_new_form_passes_where_the_kernel_takes_it(name):
    backend = get(name, "cpu")
    exercised, failures = set(), []
    for case in CASES:
        if backend.unsupported(case) is not None:
            continue
        for spelled in new_spellings(backend, case):
            spelled_case = case.replace(spelling=spelled)
            assert backend.unsupported(spelled_case) is None, spelled_case
            output, verdict = graded(backend, spelled_case)
            exercised.update(spelled.split("+"))
            if verdict.status != V.PASS:
                failures.append(f"{verdict.label} {verdict.message[:200]}\n  {spelled_case!r}")
    assert not failures, "\n".join(failures)
    refused_here = {"mask_3d"} if name == "sdpa-flash" else set()   # CPU flash: a mask is 2-d or 4-d
    assert NEW - refused_here <= exercised, NEW - refused_here - exercised


def test_cpu_flash_refuses_a_3d_mask_with_torchs_reason_and_math_takes_it():
    case = Case(sq=8, skv=8, h=2, hk=2, window=(2, 2), spelling="float_mask+mask_3d")
    reason = get("sdpa-flash", "cpu").unsupported(case)
    assert reason is not None and "attn mask shapes" in reason, reason
    assert "float_mask+mask_3d" not in get("sdpa-flash", "cpu").spellings(case.replace(spelling=""))
    assert get("sdpa-math", "cpu").unsupported(case) is None
    assert graded(get("sdpa-math", "cpu"), case)[1].status == V.PASS


@pytest.mark.parametrize("case, reason", [
    (Case(h=4, hk=2), "GQA"), (Case(d_qk=16, d_v=8), "d_qk != d_v"), (Case(scale=0.3), "explicit scale"),
    (Case(b=1, seqlens_q=(8,), seqlens_kv=(8,), layout="thd"), "thd")])
def test_multihead_attention_is_spelled_only_where_it_computes_pure_attention(case, reason):
    assert not [s for s in sdpa_spelling.all_spellings(case) if s.module], reason
    spelled = case.replace(spelling="float_mask+mha_batch_first")
    refusal = get("sdpa-math", "cpu").unsupported(spelled)
    assert refusal is not None and ("not one of" in refusal or "thd" in refusal), refusal


def test_forms_follow_the_case():
    forms = sdpa_spelling.mask_forms
    assert set(forms(Case(window=(2, 2)))) == {"", *sdpa_spelling.FORMS} - {"mask_key_row"}
    per_head = Case(h=2, hk=2, alibi_slopes=(0.5, 0.25))                   # the same per sequence, not per head
    assert "mask_2d" not in forms(per_head) and "mask_1_h" in forms(per_head) and "mask_3d" in forms(per_head)
    per_seq = Case(b=2, seqlens_kv=(3, 16))
    assert {"mask_2d", "mask_3d", "mask_1_1", "mask_1_h"}.isdisjoint(forms(per_seq))
    assert "mask_key_row" in forms(per_seq) and "mask_key_row" not in forms(per_seq.replace(causal=True))
    assert "float32_mask" not in sdpa_spelling.mask_spellings(Case(dtype="float32"))
    assert "float32_mask" in sdpa_spelling.mask_spellings(Case(dtype="bfloat16"))
    assert not [s for s in sdpa_spelling.all_spellings(Case(scale=0.5)) if s.scale]


# -- negative controls: each form's planted mistake is caught --------------------------------------------------------
def planted_sdpa(monkeypatch, wrong):
    """F.scaled_dot_product_attention as a planted kernel: `wrong` rewrites its arguments, then the real one runs."""
    real = F.scaled_dot_product_attention

    def kernel(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        attn_mask, is_causal, scale = wrong(q, attn_mask, is_causal, scale)
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)

    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel)


ALIBI = Case(b=2, sq=6, skv=9, h=2, hk=2, window=(2, 1), seqlens_kv=(9, 4), alibi_slopes=(0.5, 0.125))
SAME_PER_SEQUENCE = Case(b=2, sq=6, skv=9, h=2, hk=2, window=(2, 1), alibi_slopes=(0.5, 0.125))


@pytest.mark.parametrize("case, spelled, wrong", [
    # a [1, h, sq, skv] mask broadcast over the batch instead of the heads
    (SAME_PER_SEQUENCE, "float_mask+mask_1_h", lambda m: m.transpose(0, 1) if m.shape[0] == 1 else m),
    # a [b, h, sq, skv] mask whose batch and head dimensions are swapped
    (ALIBI, "float_mask+mask_b_h", lambda m: m.transpose(0, 1)),
    # a 2-d mask read as the first query's row, broadcast over the queries
    (Case(sq=6, skv=9, window=(2, 1)), "bool_mask+mask_2d", lambda m: m[:1] if m.dim() == 2 else m),
    # a stride-0 mask read as if every sequence and head had the first one's
    (SAME_PER_SEQUENCE, "float_mask+mask_expanded", lambda m: m[:1, :1].expand(m.shape) if 0 in m.stride() else m),
    # a transposed mask's buffer read as if it were contiguous (its strides ignored)
    (Case(sq=6, skv=9, window=(2, 1)), "bool_mask+mask_transposed",
     lambda m: m.transpose(-1, -2).contiguous().view(m.shape) if not m.is_contiguous() else m),
    # a key-padding row [b, 1, 1, skv] given to the other sequence
    (Case(b=2, sq=5, skv=9, seqlens_kv=(9, 3)), "bool_mask+mask_key_row", lambda m: m.flip(0)),
    # a float32 mask on a half-precision query read as boolean (nonzero = keep)
    (Case(sq=6, skv=9, window=(2, 1), dtype="float16"), "float32_mask",
     lambda m: m != 0 if m.dtype == torch.float32 else m),
], ids=["1_h-over-batch", "b_h-swapped", "2d-first-row", "expanded-first", "transposed-strides-ignored",
        "key-row-other-sequence", "float32-as-bool"])
@pytest.mark.parametrize("name", CPU_KERNELS)
def test_a_kernel_that_misreads_a_mask_form_is_caught(name, case, spelled, wrong, monkeypatch):
    backend = get(name, "cpu")
    spelled_case = case.replace(spelling=spelled)
    assert backend.unsupported(spelled_case) is None, backend.unsupported(spelled_case)
    assert graded(backend, spelled_case)[1].status == V.PASS       # the real kernel passes on it
    planted_sdpa(monkeypatch, lambda q, m, c, s: (wrong(m) if isinstance(m, torch.Tensor) else m, c, s))
    assert graded(backend, spelled_case)[1].status == V.FAIL


@pytest.mark.parametrize("name", CPU_KERNELS)
def test_a_kernel_that_mishandles_an_explicit_scale_is_caught_and_the_default_is_not_affected(name, monkeypatch):
    """A planted kernel that applies a given scale to q and to k (squaring it): the explicit_scale spelling fails,
    the spelling without it (the same kernel, the same case) passes."""
    backend = get(name, "cpu")
    case = Case(sq=6, skv=9, h=2, hk=2, causal=True)
    planted_sdpa(monkeypatch, lambda q, m, c, s: (m, c, None if s is None else s * s))
    assert graded(backend, case.replace(spelling="is_causal"))[1].status == V.PASS
    assert graded(backend, case.replace(spelling="is_causal+explicit_scale"))[1].status == V.FAIL


def test_an_adapter_that_takes_the_default_scale_from_d_v_is_caught(monkeypatch):
    from attnfuzz.backends.sdpa.adapter import SdpaBackend
    backend = get("sdpa-math", "cpu")
    case = Case(sq=6, skv=9, d_qk=16, d_v=4, spelling="bool_mask+explicit_scale", window=(3, 3))
    assert graded(backend, case)[1].status == V.PASS
    monkeypatch.setattr(SdpaBackend, "_scale", staticmethod(
        lambda case, spelling: 1 / math.sqrt(case.d_v) if spelling.scale else case.scale))
    assert graded(backend, case)[1].status == V.FAIL


# -- nn.MultiheadAttention --------------------------------------------------------------------------------------------
MHA_CASES = [
    (Case(b=2, sq=8, skv=8, h=2, hk=2, causal=True, dtype="float16"), "is_causal+mha_batch_first"),
    (Case(b=2, sq=8, skv=8, h=2, hk=2, causal=True, dtype="bfloat16", layout="sbhd"), "is_causal+mha_seq_first"),
    (Case(b=2, sq=6, skv=9, h=2, hk=2, seqlens_kv=(9, 4), dtype="float16"), "no_mask+key_padding_mask+mha_batch_first"),
    (Case(b=2, sq=8, skv=8, h=2, hk=2, seqlens_q=(8, 5), seqlens_kv=(6, 8), causal=True, dtype="float16",
          layout="sbhd"), "is_causal+key_padding_mask+mha_seq_first"),
    (Case(b=2, sq=6, skv=9, h=2, hk=2, window=(2, 1), seqlens_kv=(9, 4), dtype="bfloat16", grads=True),
     "bool_mask+mha_batch_first"),
    (Case(b=2, sq=6, skv=9, h=2, hk=2, window=(2, 1), alibi_slopes=(0.5, 0.125), dtype="float16", layout="sbhd"),
     "float_mask+mha_seq_first"),
    (Case(b=2, sq=6, skv=9, h=2, hk=2, window=(2, 1), dtype="float16"), "bool_mask+mask_2d+mha_batch_first"),
]
IDS = [s for _, s in MHA_CASES]


def planted_mha_sdpa(monkeypatch, wrong):
    """The F.scaled_dot_product_attention nn.MultiheadAttention calls (a global of torch.nn.functional) planted."""
    real = F.scaled_dot_product_attention

    def kernel(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        attn_mask, is_causal = wrong(attn_mask, is_causal)
        return real(q, k, v, attn_mask, dropout_p, is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel)


@pytest.mark.parametrize("case, spelled", MHA_CASES, ids=IDS)
@pytest.mark.parametrize("name", CPU_KERNELS)
def test_multihead_attention_passes_and_its_masks_misread_are_caught(name, case, spelled, monkeypatch):
    backend = get(name, "cpu")
    spelled_case = case.replace(spelling=spelled)
    assert spelled in backend.spellings(case), backend.spellings(case)
    output, verdict = graded(backend, spelled_case)
    assert verdict.status == V.PASS, verdict.message
    assert "nn.MultiheadAttention" in output.ran
    # what reaches SDPA: the mask of another sequence, or the causal hint dropped
    if spelled.startswith("is_causal") and "key_padding_mask" not in spelled:
        planted_mha_sdpa(monkeypatch, lambda m, c: (m, False))
    elif "mask_2d" in spelled:                                         # the first query's row for every query
        planted_mha_sdpa(monkeypatch, lambda m, c: (m[..., :1, :], c))
    elif case.alibi_slopes is not None:
        planted_mha_sdpa(monkeypatch, lambda m, c: (m.flip(1), c))       # the heads' biases swapped
    else:
        planted_mha_sdpa(monkeypatch, lambda m, c: (m.flip(0), c))       # the sequences' masks swapped
    assert graded(backend, spelled_case)[1].status == V.FAIL


def test_an_adapter_that_forgets_multiheadattentions_inverted_bool_mask_is_caught(monkeypatch):
    """nn.MultiheadAttention's boolean attn_mask is True where a key is masked out, SDPA's where it is seen: an
    adapter handing the module SDPA's mask fails."""
    backend = get("sdpa-math", "cpu")
    case = Case(sq=6, skv=9, h=2, hk=2, window=(2, 1), spelling="bool_mask+mha_batch_first")
    assert graded(backend, case)[1].status == V.PASS
    real = modules.module_masks

    def uninverted(case, tensors, spelling, dtype, device):
        masks = real(case, tensors, spelling, dtype, device)
        return {**masks, "attn_mask": ~masks["attn_mask"] if tensors is not None else masks["attn_mask"]}

    monkeypatch.setattr(modules, "module_masks", uninverted)
    assert graded(backend, case)[1].status == V.FAIL


def test_the_module_never_takes_its_fused_fast_path_and_its_projections_are_identities():
    case = Case(b=2, sq=4, skv=4, h=2, hk=2, d_qk=8, d_v=8, dtype="bfloat16")
    mha = modules.identity_mha(case, True, torch.bfloat16, "cpu")
    x = torch.randn(2, 4, 16, dtype=torch.bfloat16)
    assert torch.equal(mha.out_proj(x), x)
    assert all(torch.equal(y, x) for y in F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1))
    calls = []
    real = F.scaled_dot_product_attention
    try:
        F.scaled_dot_product_attention = lambda *a, **k: calls.append(1) or real(*a, **k)
        with torch.no_grad():
            modules.call(mha, x, x.clone(), x.clone(), {"attn_mask": None, "key_padding_mask": None,
                                                        "is_causal": False})
    finally:
        F.scaled_dot_product_attention = real
    assert calls == [1]


def test_the_efficient_kernels_own_mask_dtype_check_is_a_refusal_known_before_the_call():
    """torch's input check takes a float32 mask on a half query and the dispatcher picks the memory-efficient kernel,
    whose own check then raises: the spelling is refused up front (not drawn as a crash), for that kernel only, and
    the error, should it come anyway, is an Unsupported naming the check."""
    from attnfuzz.backends.base import Unsupported
    from attnfuzz.backends.sdpa import kernel_checks
    from attnfuzz.backends.sdpa.spelling import Spelling
    f32 = Spelling("float32_mask", "")
    assert "invalid dtype for bias" in kernel_checks.kernel_refusal("EFFICIENT_ATTENTION", f32, torch.float16)
    assert kernel_checks.kernel_refusal("EFFICIENT_ATTENTION", f32, torch.float32) is None
    assert kernel_checks.kernel_refusal("CUDNN_ATTENTION", f32, torch.float16) is None  # it takes it (and misreads it)
    assert kernel_checks.kernel_refusal("EFFICIENT_ATTENTION", Spelling("float_mask", ""), torch.float16) is None
    with pytest.raises(Unsupported, match="own check of the mask's dtype"):
        kernel_checks.refuse_kernel_check("EFFICIENT_ATTENTION",
                                          RuntimeError("invalid dtype for bias - should match query's dtype"))
    kernel_checks.refuse_kernel_check("EFFICIENT_ATTENTION", RuntimeError("CUDA error: misaligned address"))  # passes
