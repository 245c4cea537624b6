"""UltraImage's attention rule (mmpos.ops.entropy_scaling) against the authors' code, written out in fp64.

The reference follows thu-ml/DiT-Extrapolation (branch ``ultra-flux``): ``utils.pad_qkv`` (zero tokens up to a
multiple of 128), ``jintao/search.flash_attention_v2`` (softmax over the padded keys at ``1 / sqrt(D)``, block sums
of the weights), the processor's ``block_avg / 128`` and ``-p log p`` summed over key blocks, ``get_continuous_decay``
with ``power_decay`` (mean over query blocks, one factor per batch and head), and ``_attn_fwd_inner_decay``
(centred keys, log2-unit logits times the factor, online ``exp2`` softmax over 128-key blocks).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mmpos.ops.entropy_scaling import EntropyScaling

LOG2E = math.log2(math.e)


def reference_factor(q, k, h_min, h_max, lambda_min, lambda_max, gamma, block=128):
    """``q, k [B, H, L, D]`` fp64 -> ``[B, H]``, as the authors' code computes the decay mask's value."""
    pad = (block - q.shape[2] % block) % block
    qp = torch.cat([q, q.new_zeros(*q.shape[:2], pad, q.shape[3])], dim=2)
    kp = torch.cat([k, k.new_zeros(*k.shape[:2], pad, k.shape[3])], dim=2)
    n = qp.shape[2] // block
    weights = torch.softmax(qp @ kp.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    block_avg = weights.reshape(*q.shape[:2], n, block, n, block).sum(dim=(3, 5))
    proportion = block_avg / 128.0
    entropy = (-proportion * torch.log(proportion)).sum(dim=-1)
    if entropy.isnan().any():
        proportion = proportion + 1e-8
        entropy = (-proportion * torch.log(proportion)).sum(dim=-1)
    entropy = entropy.mean(dim=-1)
    z = (entropy - h_min) / (h_max - h_min)
    return lambda_min + (lambda_max - lambda_min) * torch.pow(1.0 - z, gamma)


def reference_attention(q, k, v, factor, block=128):
    """The decay kernel's loop: ``factor [B, H]`` on the log2-unit logits of centred keys."""
    k = k - k.mean(dim=2, keepdim=True)
    row_max = torch.full(q.shape[:3], -math.inf, dtype=q.dtype)
    row_sum = torch.ones(q.shape[:3], dtype=q.dtype)
    acc = torch.zeros_like(q)
    for start in range(0, k.shape[2], block):
        qk = q @ k[:, :, start : start + block].transpose(-1, -2) * (q.shape[-1] ** -0.5 * LOG2E)
        qk = qk * factor[..., None, None]
        new_max = torch.maximum(row_max, qk.amax(-1))
        p = torch.exp2(qk - new_max[..., None])
        rescale = torch.exp2(row_max - new_max)
        row_sum = row_sum * rescale + p.sum(-1)
        acc = acc * rescale[..., None] + p @ v[:, :, start : start + block]
        row_max = new_max
    return acc / row_sum[..., None]


def _qkv(length, heads=3, dim=16, batch=2, seed=0, sharp=(0.3, 1.5, 4.0)):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, length, heads, dim, generator=gen, dtype=torch.float64) for _ in range(3))
    q = q * torch.tensor(sharp, dtype=torch.float64)[None, None, :, None]  # heads from diffuse to focused
    return q, k + 0.5, v


@pytest.mark.parametrize(
    "length, h_min, h_max, lambda_min, lambda_max, gamma",
    [(300, 0.04, 6.25, 1.0, 1.3, 2.0), (256, 0.44, 6.0, 1.1, 1.3, 2.0), (517, 0.1, 2.5, 1.05, 1.4, 1.0)],
)
def test_factor_equals_the_authors_code_in_fp64(length, h_min, h_max, lambda_min, lambda_max, gamma):
    q, k, _ = _qkv(length)
    rule = EntropyScaling(lambda_min, lambda_max, h_min, h_max, gamma)
    expected = reference_factor(q.transpose(1, 2), k.transpose(1, 2), h_min, h_max, lambda_min, lambda_max, gamma)
    entropy = rule.entropy(q, k)
    assert ((entropy > h_min) & (entropy < h_max)).all()  # inside the range, where mmpos does not clip
    torch.testing.assert_close(rule.factor(entropy), expected, rtol=0, atol=1e-12)
    # the heads differ: focused heads get the larger factor
    assert (expected[:, 2] > expected[:, 0]).all()


def test_attention_with_the_factor_equals_the_decay_kernel_in_fp64():
    q, k, v = _qkv(300)
    rule = EntropyScaling()
    factor = rule.factor(rule.entropy(q, k))
    ours = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (rule.scale_query(q, factor), k, v)))
    expected = reference_attention(*(t.transpose(1, 2) for t in (q, k, v)), factor)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)
    plain = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
    assert (ours - plain).abs().max() > 1e-2  # the factor changes the attention by a measured amount


def test_factor_is_clipped_outside_the_entropy_range():
    rule = EntropyScaling(lambda_min=1.1, lambda_max=1.3, h_min=1.0, h_max=2.0, gamma=2.0)
    got = rule.factor(torch.tensor([0.2, 1.0, 1.5, 2.0, 3.0], dtype=torch.float64))
    assert got.tolist() == pytest.approx([1.3, 1.3, 1.1 + 0.2 * 0.25, 1.1, 1.1])


def test_masked_keys_are_left_out():
    """A key mask (Z-Image's padded captions; the authors' code has none): masked keys take no weight."""
    q, k, _ = _qkv(130, batch=1)
    rule = EntropyScaling(block=10)
    mask = torch.ones(1, 130, dtype=torch.bool)
    assert torch.equal(rule.entropy(q, k, mask), rule.entropy(q, k))
    mask[:, 100:] = False
    qh, kh = q.transpose(1, 2), k.transpose(1, 2)
    logits = (qh @ kh.transpose(-1, -2) / 4.0).masked_fill(~mask[:, None, None, :], -math.inf)
    mass = torch.softmax(logits, dim=-1).reshape(1, 3, 13, 10, 13, 10).sum(dim=(3, 5)) / 10
    expected = (-torch.xlogy(mass, mass)).sum(-1).mean(-1)
    torch.testing.assert_close(rule.entropy(q, k, mask), expected, rtol=0, atol=1e-12)
    assert (expected - rule.entropy(q, k)).abs().max() > 1e-3


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="lambda_min"):
        EntropyScaling(lambda_min=1.5, lambda_max=1.2)
    with pytest.raises(ValueError, match="h_min"):
        EntropyScaling(h_min=3.0, h_max=2.0)
    with pytest.raises(ValueError, match="gamma"):
        EntropyScaling(gamma=0.0)
