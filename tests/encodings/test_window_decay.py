"""UltraViCo's attention rule (mmpos.ops.window_decay) against the authors' Wan kernel, written out in fp64.

The reference below follows ``_attn_fwd_inner`` of thu-ml/DiT-Extrapolation (branch ``ultra-wan``,
``sageattn/attn_qk_int8_per_block.py``) without the int8 quantisation: keys centred (SageAttention's ``smooth_k``),
logits in log2 units (``sm_scale * log2(e)``), key blocks of 128 with an online softmax in ``exp2``, the decay
``where(dist <= W / 2 | qk < 0, qk, qk * alpha)``, the first frame's queries masked with ``-1e4`` from keys past the
window. The one departure, named in the module docstring: the mask's two comparisons count whole frames.
"""

from __future__ import annotations

import math

import pytest
import torch

from mmpos.ops.window_decay import WindowDecay

LOG2E = math.log2(math.e)  # the kernel's 1.44269504 differs by 6e-10 relative (below fp32's resolution)


def kernel_reference(q, k, v, frame_tokens, train_frames, alpha, block=128):
    """``q, k, v [B, H, L, D]`` fp64 -> ``[B, H, L, D]``: the kernel's loop, block by block over the keys."""
    k = k - k.mean(dim=2, keepdim=True)
    length = k.shape[2]
    window_th = frame_tokens * train_frames / 2
    m = torch.arange(length)[:, None]
    row_max = torch.full(q.shape[:3], -math.inf, dtype=q.dtype)
    row_sum = torch.ones(q.shape[:3], dtype=q.dtype)  # the kernel starts l_i at 1 (exp2(-inf) scales it away)
    acc = torch.zeros_like(q)
    for start in range(0, length, block):
        n = torch.arange(start, min(start + block, length))[None, :]
        qk = q @ k[:, :, start : start + block].transpose(-1, -2) * (q.shape[-1] ** -0.5 * LOG2E)
        keep = ((m - n).abs() <= window_th) | (qk < 0)
        qk = torch.where(keep, qk, qk * alpha)
        first_frame_to_beyond = (m < frame_tokens) & (n >= train_frames * frame_tokens)
        qk = torch.where(first_frame_to_beyond, torch.full_like(qk, -1e4), qk)
        new_max = torch.maximum(row_max, qk.amax(-1))
        p = torch.exp2(qk - new_max[..., None])
        rescale = torch.exp2(row_max - new_max)
        row_sum = row_sum * rescale + p.sum(-1)
        acc = acc * rescale[..., None] + p @ v[:, :, start : start + block]
        row_max = new_max
    return acc / row_sum[..., None]


def _qkv(length, heads=2, dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    # a common offset on the keys: centring them then changes which logits are positive
    q, k, v = (torch.randn(1, length, heads, dim, generator=gen, dtype=torch.float64) for _ in range(3))
    return q, k + 0.7, v


@pytest.mark.parametrize(
    "frame_tokens, train_frames, frames, alpha", [(12, 3, 7, 0.9), (20, 2, 5, 0.6), (7, 4, 9, 0.75), (9, 1, 3, 0.5)]
)
def test_equals_the_kernel_written_out_in_fp64(frame_tokens, train_frames, frames, alpha):
    q, k, v = _qkv(frame_tokens * frames)
    rule = WindowDecay(train_frames=train_frames, alpha=alpha)
    ours = rule.attend(q, k, v, frame_tokens, block=50)  # query blocks unrelated to the kernel's 128
    ref = kernel_reference(*(t.transpose(1, 2) for t in (q, k, v)), frame_tokens, train_frames, alpha)
    assert (ours - ref.transpose(1, 2)).abs().max() < 1e-12
    plain = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
    assert (ours - plain.transpose(1, 2)).abs().max() > 1e-3  # the rule changes the output


def test_without_decay_or_mask_it_is_softmax_attention():
    q, k, v = _qkv(12 * 6)
    rule = WindowDecay(train_frames=2, alpha=1.0, isolate_first_frame=False)
    plain = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
    assert (rule.attend(q, k, v, 12) - plain.transpose(1, 2)).abs().max() < 1e-12


def test_decay_moves_attention_inside_the_window():
    frame_tokens, train_frames = 10, 2
    q, k, v = _qkv(frame_tokens * 8)
    rows = cols = torch.arange(q.shape[1])
    scores = q.transpose(1, 2) @ (k - k.mean(1, keepdim=True)).permute(0, 2, 3, 1) * q.shape[-1] ** -0.5
    far = (rows[:, None] - cols[None, :]).abs() > frame_tokens * train_frames / 2
    mass = {}
    for alpha in (1.0, 0.5):
        rule = WindowDecay(train_frames=train_frames, alpha=alpha, isolate_first_frame=False)
        mass[alpha] = torch.softmax(rule.logits(scores, rows, cols, frame_tokens), -1)[..., far].sum()
    assert mass[0.5] < 0.9 * mass[1.0]


def test_first_frame_does_not_see_past_the_window():
    frame_tokens, train_frames = 6, 2
    q, k, v = _qkv(frame_tokens * 5)
    rows = cols = torch.arange(q.shape[1])
    scores = torch.randn(1, 2, q.shape[1], q.shape[1], dtype=torch.float64)
    weights = torch.softmax(WindowDecay(train_frames, 0.9).logits(scores, rows, cols, frame_tokens), -1)
    assert weights[:, :, :frame_tokens, frame_tokens * train_frames :].abs().max() == 0
    assert weights[:, :, frame_tokens:, frame_tokens * train_frames :].min() > 0


def test_active_only_past_the_training_length():
    rule = WindowDecay(train_frames=21)
    assert not rule.active(21 * 1560, 1560) and rule.active(22 * 1560, 1560)


@pytest.mark.parametrize("options", [dict(train_frames=0), dict(train_frames=2.0), dict(train_frames=3, alpha=0.0)])
def test_bad_options_are_named(options):
    with pytest.raises(ValueError, match="train_frames|alpha"):
        WindowDecay(**options)


def test_partial_frames_are_refused():
    q, k, v = _qkv(13)
    with pytest.raises(ValueError, match="frame_tokens"):
        WindowDecay(train_frames=1).attend(q, k, v, 6)


def hunyuan_kernel_reference(q, k, v, frame_tokens, train_frames, alpha, text, padded, block=128):
    """The authors' HunyuanVideo kernel (branch ``ultra-hunyuan``, ``_attn_fwd_inner``) in fp64, ``mask_factor`` 1:
    ``q, k, v [B, H, L, D]`` of video tokens then ``text`` text tokens, the last ``padded`` of them padding."""
    k = k - k.mean(dim=2, keepdim=True)
    length = k.shape[2]
    m = torch.arange(length)[:, None]
    row_max = torch.full(q.shape[:3], -math.inf, dtype=q.dtype)
    row_sum = torch.ones(q.shape[:3], dtype=q.dtype)
    acc = torch.zeros_like(q)
    for start in range(0, length, block):
        n = torch.arange(start, min(start + block, length))[None, :]
        qk = q @ k[:, :, start : start + block].transpose(-1, -2) * (q.shape[-1] ** -0.5 * LOG2E)
        pad = (n > length - padded - 1) | (m > length - padded - 1)  # mask1 | mask2
        video = (length - n > text) & (length - m > text)  # mask3 (the kernel's 256 text tokens)
        near = (m - n).abs() <= frame_tokens * train_frames / 2
        qk = torch.where(~near & video & (qk > 0), qk * alpha, qk)
        qk = torch.where(pad, torch.full_like(qk, -1e4), qk)
        new_max = torch.maximum(row_max, qk.amax(-1))
        p = torch.exp2(qk - new_max[..., None])
        rescale = torch.exp2(row_max - new_max)
        row_sum = row_sum * rescale + p.sum(-1)
        acc = acc * rescale[..., None] + p @ v[:, :, start : start + block]
        row_max = new_max
    return acc / row_sum[..., None]


@pytest.mark.parametrize("frame_tokens, train_frames, frames, text, padded", [(12, 3, 7, 9, 3), (20, 2, 5, 6, 0)])
def test_joint_video_and_text_equal_the_hunyuan_kernel_in_fp64(frame_tokens, train_frames, frames, text, padded):
    video = frame_tokens * frames
    q, k, v = _qkv(video + text)
    keep = torch.ones(video + text, dtype=torch.bool)
    keep[video + text - padded :] = False
    mask = keep[None, None, None, :] & keep[None, None, :, None]  # HunyuanVideo 1.5's processor builds this
    rule = WindowDecay(train_frames=train_frames, alpha=0.7, isolate_first_frame=False)
    ours = rule.attend(q, k, v, frame_tokens, block=50, video_tokens=video, mask=mask)
    ref = hunyuan_kernel_reference(
        *(t.transpose(1, 2) for t in (q, k, v)), frame_tokens, train_frames, 0.7, text, padded
    )
    real = slice(0, video + text - padded)  # padded queries: the kernel spreads them evenly, mmpos gives zeros
    assert (ours[:, real] - ref.transpose(1, 2)[:, real]).abs().max() < 1e-12
    assert ours[:, video + text - padded :].abs().sum() == 0
