"""HRDiT's HAP (mmpos.ops.head_scopes) against the authors' FlexAttention mask, written out in fp64.

The reference follows github.com/zylwithxy/HRDiT ``hrdit/hap.py``: ``band_blocks`` (``max(2 * int(a // 64 + b *
(L // 64)) - 1, 1)``), the half width ``(band - 1) // 2``, and ``mask_mod`` (text queries and keys always, image
blocks within the half width, anchor blocks ``kb % stride == 0`` with ``2 ** 30`` when off), applied as a dense
boolean mask to softmax attention."""

from __future__ import annotations

import pytest
import torch

from mmpos.ops.head_scopes import HeadScopes

BLOCK, ANCHOR_OFF = 64, 1 << 30


def reference_mask(length, text, alphas, betas, anchor_stride, block=BLOCK):
    nbx = length // block
    band = [max(2 * int(a // block + b * nbx) - 1, 1) for a, b in zip(alphas, betas)]
    half = torch.tensor([(int(x) - 1) // 2 for x in band])
    stride = anchor_stride if anchor_stride and anchor_stride > 0 else ANCHOR_OFF
    q = torch.arange(length)[:, None]
    k = torch.arange(length)[None, :]
    qb, kb = (q - text) // block, (k - text) // block
    masks = [(q < text) | (k < text) | ((qb - kb).abs() <= half[h]) | (kb % stride == 0) for h in range(len(alphas))]
    return torch.stack(masks)


def masked_attention(q, k, v, mask, scale):
    logits = torch.einsum("blhd,bmhd->bhlm", q, k) * scale
    weights = torch.softmax(logits.masked_fill(~mask[None], float("-inf")), dim=-1)
    return torch.einsum("bhlm,bmhd->blhd", weights, v)


CASES = [
    # length, text, alphas, betas, anchor stride, block
    (8 + 16 * 11 + 5, 8, (16.0, 48.0, 0.0), (0.0, 0.0, 0.1), 4, 16),
    (6 + 8 * 20, 6, (8.0, 40.0), (0.05, 0.0), 0, 8),
    (300, 0, (32.0, 32.0, 96.0, 200.0), (0.0, 0.0, 0.0, 0.0), 3, 16),
]


@pytest.mark.parametrize("length, text, alphas, betas, stride, block", CASES)
def test_mask_equals_the_authors(length, text, alphas, betas, stride, block):
    scopes = HeadScopes(alphas, betas, text_tokens=text, block=block, anchor_stride=stride)
    assert torch.equal(scopes.mask(length), reference_mask(length, text, alphas, betas, stride, block))


@pytest.mark.parametrize("length, text, alphas, betas, stride, block", CASES)
def test_pruned_attention_equals_the_masked_attention_in_fp64(length, text, alphas, betas, stride, block):
    scopes = HeadScopes(alphas, betas, text_tokens=text, block=block, anchor_stride=stride)
    gen = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(2, length, len(alphas), 8, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = reference_mask(length, text, alphas, betas, stride, block)
    assert (~mask).any()  # something is pruned
    expected = masked_attention(q, k, v, mask, 0.4)
    torch.testing.assert_close(scopes.attend(q, k, v, scale=0.4), expected, rtol=0, atol=1e-12)


def test_the_authors_flux_plan_prunes_most_of_a_4k_sequence():
    """Their shipped plan (alpha 2048, beta 0 for every head) at 4096 px (512 text + 256 x 256 image tokens):
    a band of 63 blocks, plus anchors every 32 blocks (their default)."""
    scopes = HeadScopes((2048.0,), (0.0,), anchor_stride=32)
    length = 512 + 256 * 256
    assert scopes.half_widths(length) == [31]
    kept = (512 + 63 * 64 + (1024 // 32 - 2) * 64) / length  # text, the band, the anchors outside it
    assert 0.09 < kept < 0.11


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="one value per head"):
        HeadScopes((1.0, 2.0), (0.0,))
    with pytest.raises(ValueError, match="2 heads, the attention runs 3"):
        HeadScopes((1.0, 2.0), (0.0, 0.0), text_tokens=0).attend(*(torch.zeros(1, 8, 3, 4) for _ in range(3)))
