"""The nn.MultiheadAttention spellings are probed on what the module's own code hands SDPA, with its GEMMs and the
kernel stubbed (modules.dispatch_only): the probe must see exactly the arguments a real call passes, answer as
torch's dispatcher answers for them, and run no projection or attention kernel (on CUDA that would build a cuDNN
graph per shape)."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings

from attnfuzz.backends import get
from attnfuzz.backends.sdpa import modules
from attnfuzz.backends.sdpa.spelling import all_spellings, sdpa_inputs, skeleton
from attnfuzz.engine.harness import cases_for
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space


def _described(args) -> list:
    return [(tuple(x.shape), x.stride(), x.dtype, x.requires_grad) if isinstance(x, torch.Tensor) else x
            for x in args]


def _sdpa_arguments(case: Case, spelling, dry: bool) -> list:
    """What nn.MultiheadAttention passes F.scaled_dot_product_attention for the spelling: from a real call (a spy
    that calls through) or from a dispatch_only call."""
    backend = get("sdpa-flash", "cpu")
    q, k, v = skeleton(case, "cpu")
    leaves = sdpa_inputs(case, q.zero_(), k.zero_(), v.zero_(), spelling, grads=case.grads)[0]
    mha = backend._mha(case, q.dtype)
    masks = modules.module_masks(case, None, spelling, q.dtype, "cpu")
    seen, real = [], torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(_described(args) + sorted(kwargs.items()))
        return args[0].new_empty(*args[0].shape[:-1], args[2].shape[-1]) if dry else real(*args, **kwargs)

    embedded = [modules.embedded(case, x) for x in leaves]
    if dry:
        with modules.dispatch_only(spy), torch.set_grad_enabled(case.grads):
            modules.call(mha, *embedded, masks)
    else:
        torch.nn.functional.scaled_dot_product_attention = spy
        try:
            with torch.set_grad_enabled(case.grads):
                modules.call(mha, *embedded, masks)
        finally:
            torch.nn.functional.scaled_dot_product_attention = real
    assert len(seen) == 1
    return seen[0]


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(cases_for(get("sdpa-flash", "cpu"), Space.for_device("cpu").replace(max_len=96, max_head_dim=64)))
def test_the_dry_module_call_hands_sdpa_what_a_real_call_does(case):
    for spelling in [s for s in all_spellings(case) if s.module]:
        assert _sdpa_arguments(case, spelling, dry=True) == _sdpa_arguments(case, spelling, dry=False), spelling.name


def test_the_comparison_sees_requires_grad():
    """The control: the same call with and without gradients differs in what it hands SDPA."""
    case = Case(b=1, sq=5, skv=5, h=2, hk=2, d_qk=8, d_v=8, dtype="float32", layout="bshd", grads=True)
    spelling = next(s for s in all_spellings(case) if s.module)
    assert _sdpa_arguments(case, spelling, dry=True) != _sdpa_arguments(case.replace(grads=False), spelling, dry=True)


def test_the_probe_answers_as_the_dispatcher_does_and_runs_no_kernel(monkeypatch):
    from torch.nn.attention import SDPBackend
    asked = []

    def choose(q, k, v, mask, dropout, is_causal, scale=None, enable_gqa=False):
        asked.append((mask is not None and mask.dtype.is_floating_point, is_causal))
        refused = mask is not None and mask.dtype.is_floating_point   # a dispatcher that refuses additive masks
        return int(SDPBackend.MATH if refused else SDPBackend.FLASH_ATTENTION)

    gemms = []
    monkeypatch.setattr(torch, "_fused_sdp_choice", choose)
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a, **k: gemms.append(a) or torch.zeros(0))
    backend = get("sdpa-flash", "cpu")
    case = Case(b=2, sq=6, skv=6, h=2, hk=2, d_qk=8, d_v=8, dtype="float32", layout="bshd", mask_density=0.5)
    probed = {s.name: backend._probe(case, s) for s in all_spellings(case) if s.module}
    assert probed and asked and not gemms
    # nn.MultiheadAttention turns a bool mask into an additive one of the query's dtype: every mask spelling refused
    assert all(reason is not None and "chose backend" in reason for reason in probed.values()), probed
    plain = Case(b=2, sq=6, skv=6, h=2, hk=2, d_qk=8, d_v=8, dtype="float32", layout="bshd")
    answers = {s.mask: backend._probe(plain, s) for s in all_spellings(plain) if s.module}
    assert answers["no_mask"] is None and answers["float_mask"] is not None, answers
    assert torch.nn.functional.scaled_dot_product_attention is not None and not gemms
