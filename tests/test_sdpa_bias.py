"""The ALiBi bias handed to the CUDA efficient / cuDNN LSE ops keeps its heads (found on the H200: the adapter
padded it as a one-head mask and crashed on every ALiBi case with h > 1)."""

import torch

from attnfuzz.backends.sdpa.spelling import aligned_bias


def test_per_head_bias_keeps_its_heads():
    bias = torch.arange(2 * 3 * 5, dtype=torch.float32).reshape(1, 2, 3, 5)
    out = aligned_bias(bias, 2)
    assert out.shape == (1, 2, 3, 5) and torch.equal(out, bias)


def test_one_head_mask_is_expanded_over_heads():
    mask = torch.randn(2, 1, 3, 9)
    out = aligned_bias(mask, 4)
    assert out.shape == (2, 4, 3, 9) and torch.equal(out[:, 3], mask[:, 0])
