"""The bring-your-own-kernel contract: a correct kernel passes everything it accepts, deliberately wrong ones FAIL
with the right diagnosis, cases needing a field the kernel lacks are refused, and bad specs name the fix.

`example_attention` below is a correct kernel of the contract (fuzz/backends/custom.py), written in plain torch:

    python3 -m attnfuzz run --backend tests.test_custom_backend:example_attention
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from attnfuzz.backends import get
from attnfuzz.backends.base import Unsupported
from attnfuzz.backends.custom import load_custom, needed_fields
from attnfuzz.engine.harness import cases_for
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.space import Space

HERE = __name__


def _attention(q, k, v, *, causal, window, bottom_right, scale, softcap=None, alibi_slopes=None, sink_logits=None,
               mask=None, seqlens_q=None, seqlens_kv=None, head_of=None):
    """The contract's math in fp32 (fp64 for fp64 inputs); `head_of` maps query heads to KV heads (tests break it)."""
    b, sq, h, _ = q.shape
    skv, hk = k.shape[1], k.shape[2]
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    heads = head_of if head_of is not None else torch.arange(h) // (h // hk)
    kk, vv = k.to(work)[:, :, heads], v.to(work)[:, :, heads]
    s = torch.einsum("bqhd,bkhd->bhqk", q.to(work), kk) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    lq = seqlens_q.long() if seqlens_q is not None else torch.full((b,), sq, device=q.device)
    lk = seqlens_kv.long() if seqlens_kv is not None else torch.full((b,), skv, device=q.device)
    off = (lk - lq) if bottom_right else torch.zeros_like(lq)
    i = torch.arange(sq, device=q.device)[None, :, None]
    j = torch.arange(skv, device=q.device)[None, None, :]
    rel = j - (i + off[:, None, None])                  # key position relative to query i's diagonal, [b, sq, skv]
    left, right = window[0], 0 if causal else window[1]
    keep = (i < lq[:, None, None]) & (j < lk[:, None, None])
    if left is not None:
        keep = keep & (rel >= -left)
    if right is not None:
        keep = keep & (rel <= right)
    keep = keep[:, None] if mask is None else keep[:, None] & mask
    if alibi_slopes is not None:
        s = s - alibi_slopes.to(work)[None, :, None, None] * rel.abs()[:, None].to(work)
    s = s.masked_fill(~keep, float("-inf"))
    top = s.amax(-1, keepdim=True)
    if sink_logits is not None:
        top = torch.maximum(top, sink_logits.to(work)[None, :, None, None])
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(s - top)
    denom = weights.sum(-1, keepdim=True)
    if sink_logits is not None:
        denom = denom + torch.exp(sink_logits.to(work)[None, :, None, None] - top)
    p = weights / torch.where(denom > 0, denom, torch.ones_like(denom))
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv).to(q.dtype)
    return out, (top + torch.log(denom)).squeeze(-1)


def example_attention(q, k, v, *, causal, window, bottom_right, scale, softcap=None, alibi_slopes=None,
                      sink_logits=None, mask=None, seqlens_q=None, seqlens_kv=None):
    """A correct kernel of the custom contract: every optional field, gradients by autograd, (out, lse)."""
    return _attention(q, k, v, causal=causal, window=window, bottom_right=bottom_right, scale=scale, softcap=softcap,
                      alibi_slopes=alibi_slopes, sink_logits=sink_logits, mask=mask, seqlens_q=seqlens_q,
                      seqlens_kv=seqlens_kv)


def core_only(q, k, v, *, causal, window, bottom_right, scale):
    """Correct, but takes none of the optional fields."""
    return _attention(q, k, v, causal=causal, window=window, bottom_right=bottom_right, scale=scale)[0]


def key_padding_only(q, k, v, *, causal, window, bottom_right, scale, seqlens_kv=None):
    return _attention(q, k, v, causal=causal, window=window, bottom_right=bottom_right, scale=scale,
                      seqlens_kv=seqlens_kv)[0]


# -- deliberately wrong kernels: one planted bug each ------------------------------------------------------------------
def wrong_alignment(q, k, v, *, bottom_right, **kw):
    return _attention(q, k, v, bottom_right=False, **kw)


def wrong_window(q, k, v, *, window, **kw):
    return _attention(q, k, v, window=(window[0] + 1 if window[0] is not None else None, window[1]), **kw)


def wrong_gqa(q, k, v, **kw):
    return _attention(q, k, v, head_of=torch.arange(q.shape[2]) % k.shape[2], **kw)


def wrong_scale(q, k, v, *, scale, **kw):
    return _attention(q, k, v, scale=1 / math.sqrt(v.shape[-1]), **kw)


def zeros(q, k, v, **kw):
    return torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype, device=q.device)


def lse_in_log2(q, k, v, **kw):
    out, lse = _attention(q, k, v, **kw)
    return out, lse / math.log(2)


def head_major(q, k, v, **kw):
    """The right output, differentiable, in the wrong shape: [b, h, sq, d_v]."""
    return _attention(q, k, v, **kw)[0].transpose(1, 2)


def lse_transposed(q, k, v, **kw):
    """The right output, and the right LSE as [b, sq, h]."""
    out, lse = _attention(q, k, v, **kw)
    return out, lse.transpose(1, 2)


def wrong_dv(q, k, v, **kw):
    """The right output, but V detached, so dV is lost."""
    return _attention(q, k, v.detach(), **kw)


def not_differentiable(q, k, v, **kw):
    with torch.no_grad():
        return _attention(q, k, v, **kw)


def not_a_tensor(q, k, v, **kw):
    return [1, 2, 3]


def picky(q, k, v, *, causal, window, bottom_right, scale):
    return core_only(q, k, v, causal=causal, window=window, bottom_right=bottom_right, scale=scale)


picky.supports = lambda case: "no float16 path" if case.dtype == "float16" else case.h <= 2

NOT_CALLABLE = 3


def fused_attention(q, k, v, **kw):
    return example_attention(q, k, v, **kw)


fused_attention.family = "fused"


def misfamilied(q, k, v, **kw):
    return example_attention(q, k, v, **kw)


misfamilied.family = "flash"


def missing_window(q, k, v, *, causal, bottom_right, scale):
    return q


def stray_required(q, k, v, *, causal, window, bottom_right, scale, block_size):
    return q


def backend(fn_name: str):
    return load_custom(f"{HERE}:{fn_name}", "cpu")


def graded(b, case: Case):
    tensors = materialize(case)
    output = b.run(case, tensors)
    return output, grade(case, tensors, output, family=b.family)


CASES = [
    Case(),
    Case(sq=12, skv=20, causal=True, h=4, hk=2),
    Case(sq=20, skv=12, causal=True, alignment="bottom_right", grads=True),
    Case(b=2, sq=16, skv=16, seqlens_q=(5, 16), seqlens_kv=(16, 0), window=(3, 1), alignment="bottom_right",
         grads=True),
    Case(sq=16, skv=16, mask_density=0.5, alibi_slopes=(0.5, 0.25), h=2, hk=1, dtype="bfloat16", grads=True),
    Case(sq=16, skv=20, softcap=0.5, softmax="learnable", layout="sbhd", memory="transposed", h=4, hk=2, grads=True),
    Case(sq=16, skv=16, softmax="off_by_one", memory="expanded_kv", h=4, hk=2, dtype="float16", grads=True),
    Case(sq=8, skv=12, d_qk=16, d_v=8, dtype="float64", scale=0.7, grads=True),
]


def test_the_example_kernel_passes_every_feature():
    b = backend("example_attention")
    for case in CASES:
        assert b.unsupported(case) is None, (case, b.unsupported(case))
        output, verdict = graded(b, case)
        assert verdict.status == V.PASS, f"{verdict.label} {verdict.message}\n  {case!r}"
        assert output.lse is not None and (output.dq is not None) == case.grads and output.ran == b.name


def test_the_example_kernel_passes_random_cases():
    b = backend("example_attention")
    seen: Counter = Counter()
    failures = []

    @settings(max_examples=150, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases_for(b, Space(max_batch=2, max_len=32, max_heads=4, max_head_dim=32)))
    def check(case):
        if b.unsupported(case) is not None:
            seen["UNSUPPORTED"] += 1
            return
        verdict = graded(b, case)[1]
        seen[verdict.label] += 1
        if verdict.status != V.PASS:
            failures.append(f"{verdict.label} {verdict.message[:300]}\n  {case!r}")

    check()
    assert not failures, "\n".join(failures[:5])
    assert seen["PASS"] >= 120, seen


@pytest.mark.parametrize("fn_name, case, diagnosis", [
    ("wrong_alignment", Case(sq=6, skv=10, causal=True, alignment="bottom_right"), V.MASK_ALIGNMENT),
    ("wrong_window", Case(sq=10, skv=10, window=(2, 0)), V.WINDOW_OFF_BY_ONE),
    ("wrong_gqa", Case(sq=4, skv=6, h=4, hk=2), V.GQA_MAPPING),
    ("wrong_scale", Case(sq=4, skv=6, d_qk=16, d_v=32), V.SCALE),
    ("zeros", Case(sq=4, skv=6), V.ALL_ZERO),
    ("lse_in_log2", Case(sq=4, skv=6), V.LSE),
    ("wrong_dv", Case(sq=4, skv=6, grads=True), V.GRADIENT),
    ("head_major", Case(sq=4, skv=6, h=2), V.SHAPE),
    ("head_major", Case(sq=4, skv=6, h=2, grads=True), V.SHAPE),   # not a crash of the backward pass
    ("lse_transposed", Case(sq=4, skv=6, h=2), V.SHAPE),
])
def test_a_wrong_kernel_fails_with_the_right_diagnosis(fn_name, case, diagnosis):
    b = backend(fn_name)
    assert b.unsupported(case) is None
    _, verdict = graded(b, case)
    assert verdict.label == f"FAIL:{diagnosis}", (verdict.label, verdict.message)
    assert graded(backend("example_attention"), case)[1].status == V.PASS       # the same case, correct kernel


def test_cases_needing_a_field_the_kernel_lacks_are_refused():
    b = backend("core_only")
    assert b.unsupported(Case(causal=True, h=4, hk=2, grads=True)) is None
    for case, field in [(Case(softcap=5.0), "softcap"), (Case(alibi_slopes=(0.5,)), "alibi_slopes"),
                        (Case(softmax="off_by_one"), "sink_logits"), (Case(mask_density=0.5), "mask"),
                        (Case(b=2, seqlens_q=(3, 16), seqlens_kv=(16, 2)), "seqlens_kv")]:
        reason = b.unsupported(case)
        assert reason is not None and field in reason, (case, reason)
    assert graded(b, Case(causal=True, h=4, hk=2, grads=True))[1].status == V.PASS
    # Query padding changes a graded row only through a bottom-right band or ALiBi.
    padding = Case(b=2, seqlens_q=(3, 16), seqlens_kv=(16, 2), causal=True)
    assert needed_fields(padding) == ("seqlens_kv",)
    assert needed_fields(padding.replace(alignment="bottom_right")) == ("seqlens_q", "seqlens_kv")
    keys_only = backend("key_padding_only")
    assert keys_only.unsupported(padding) is None and graded(keys_only, padding)[1].status == V.PASS
    assert "seqlens_q" in keys_only.unsupported(padding.replace(alignment="bottom_right"))
    assert "packed thd" in backend("example_attention").unsupported(padding.replace(layout="thd"))


def test_supports_narrows_with_its_reason():
    b = backend("picky")
    assert b.unsupported(Case(dtype="float16")) == "no float16 path"
    assert "supports(case) returned False" in b.unsupported(Case(h=4, hk=4))
    assert b.unsupported(Case(h=2, hk=2)) is None


def test_gradients_need_a_differentiable_output():
    b = backend("not_differentiable")
    case = Case(grads=True)
    assert graded(b, case.replace(grads=False))[1].status == V.PASS
    with pytest.raises(Unsupported, match="not differentiable"):
        b.run(case, materialize(case))


def test_a_result_that_is_not_a_tensor_is_named():
    with pytest.raises(TypeError, match="returned list"):
        backend("not_a_tensor").run(Case(), materialize(Case()))


def test_the_registry_loads_a_spec():
    b = get(f"{HERE}:example_attention", "cpu")
    assert b.name == f"{HERE}:example_attention" and b.spellings(Case()) == ("",)
    assert "spelling" in b.unsupported(Case(spelling="bool_mask"))


@pytest.mark.parametrize("spec, expected", [
    ("no_colon_here", "one colon"),
    ("a:b:c", "one colon"),
    (":example_attention", "one colon"),
    ("no_such_package_xyz.mod:fn", "cannot be imported"),
    (f"{HERE}:no_such_function", "has no attribute 'no_such_function'"),
    (f"{HERE}:NOT_CALLABLE", "not callable"),
    (f"{HERE}:missing_window", "missing keyword(s) ['window']"),
    (f"{HERE}:stray_required", "['block_size'] have no default"),
    (f"{HERE}:misfamilied", "family='flash' is not one of ['custom', 'fused']"),
])
def test_bad_specs_name_the_spec_and_the_fix(spec, expected):
    with pytest.raises(ValueError) as err:
        load_custom(spec, "cpu")
    assert repr(spec) in str(err.value) and expected in str(err.value), str(err.value)


def test_the_kernel_module_is_found_where_the_run_imported_it_from():
    root = str(Path(__file__).resolve().parents[1])
    assert backend("zeros").import_path == root  # tests.test_custom_backend: two dotted parts up from the file


@pytest.mark.parametrize("fn_name, code", [("zeros", 1), ("example_attention", 0)])
def test_a_custom_kernels_script_runs_from_its_folder_or_with_it_on_pythonpath(tmp_path, fn_name, code):
    """The script imports the kernel's module by name, from the current folder or PYTHONPATH, and names no folder of
    this machine (it goes into bug reports as it is); a correct kernel's script (the control) passes there too, so
    exit 1 is the bug, not a failed import."""
    from attnfuzz.store import corpus as corpus_io
    entry = corpus_io.Entry(f"{HERE}:{fn_name}", Case(sq=4, skv=4, d_qk=8, d_v=8),
                            V.Verdict(V.FAIL, V.ALL_ZERO, "every graded output element is 0"))
    script = corpus_io.save(tmp_path / "corpus", entry).with_suffix(".py")
    root = Path(__file__).resolve().parents[1]
    assert str(root) not in script.read_text() and str(tmp_path) not in script.read_text()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for cwd, extra in ((root, {}), (elsewhere, {"PYTHONPATH": str(root)})):
        ran = subprocess.run([sys.executable, str(script)], cwd=cwd, env={**env, **extra}, capture_output=True,
                             text=True, timeout=300)
        assert ran.returncode == code, ran.stdout + ran.stderr
        assert "max |out - float64|" in ran.stdout


def test_a_custom_kernels_script_exits_2_saying_where_to_run_it_when_the_kernel_cannot_be_imported(tmp_path):
    from attnfuzz.store import corpus as corpus_io
    entry = corpus_io.Entry(f"{HERE}:zeros", Case(sq=4, skv=4, d_qk=8, d_v=8), V.Verdict(V.FAIL, V.ALL_ZERO))
    script = corpus_io.save(tmp_path, entry).with_suffix(".py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)   # a folder the kernel's module cannot be imported from
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "cannot run this repro here" in ran.stderr and "cannot be imported" in ran.stderr, ran.stderr
    assert f"run it from the folder where `import {HERE}` works" in ran.stderr, ran.stderr


@pytest.mark.parametrize("fn_name, said", [
    ("head_major", "wrong shape: got (1, 2, 4, 8), expected (1, 4, 2, 8) (b, sq, h, d_v)"),
    ("lse_transposed", "wrong shape: lse got (1, 4, 2), expected (1, 2, 4) (b, h, sq)"),
])
def test_a_shape_findings_repro_script_says_so_and_exits_1(tmp_path, fn_name, said):
    """The script checks the shape before it indexes the output by the contract's axes (it used to die of an
    IndexError in its own checks); the correct kernel's script passes (test above)."""
    from attnfuzz.engine.harness import run_case
    from attnfuzz.store import corpus as corpus_io
    case = Case(sq=4, skv=6, h=2, d_qk=8, d_v=8)
    verdict = run_case(backend(fn_name), case)
    assert verdict.label == "FAIL:SHAPE", verdict
    script = corpus_io.save(tmp_path, corpus_io.Entry(f"{HERE}:{fn_name}", case, verdict)).with_suffix(".py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    ran = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 1 and said in ran.stdout, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stderr, ran.stderr


def test_a_kernel_declares_the_fused_gradient_baseline():
    """fn.family = "fused" is the backend's tolerance family (oracles/tolerance.py, FUSED_BACKWARD); else "custom"."""
    assert load_custom(f"{HERE}:fused_attention").family == "fused"
    assert load_custom(f"{HERE}:example_attention").family == "custom"
