"""FreeLOC's VRPR (mmpos.ops.frame_reencoding) against the authors' Wan 2.1 code, written out in fp64.

The reference follows Westlake-AGI-Lab/FreeLOC (``wan/modules/model_freeloc.py``, ``WanSelfAttention.forward`` with
``rp_map_kwargs``; ``generate_VRPR_mask_mod``; ``vrpr_attention`` in ``wan/modules/attention.py``): un-rotated q and
k rotated by Wan's complex rope (``rope_params``, ``rope_apply_custom_fp``) at each band's frame positions, the
near band as a sliding-window attention of ``(w1 - 1) * frame_tokens`` tokens, the four others under their
token-distance masks (rounded up to 128), and the five outputs merged by their log-sum-exps. mmpos gets q and k
rotated at the stock positions and rotates them further (``shift``).
"""

from __future__ import annotations

import math

import pytest
import torch

from mmpos.ops.frame_reencoding import FrameReencoding


def rope_params(max_len, dim, theta=10000.0):
    freqs = torch.outer(torch.arange(max_len), 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    return torch.polar(torch.ones_like(freqs), freqs)


def wan_freqs(head_dim):
    d = head_dim
    freqs = torch.cat(
        [rope_params(1024, d - 4 * (d // 6)), rope_params(1024, 2 * (d // 6)), rope_params(1024, 2 * (d // 6))], 1
    )
    c = d // 2
    return freqs.split([c - 2 * (c // 3), c // 3, c // 3], dim=1)


def rope_at(x, grid, freqs, frame_positions):
    """``rope_apply_custom_fp``: ``x [1, L, H, D]`` rotated at time ``frame_positions [F]``, rows and cols stock."""
    f, h, w = grid
    xc = torch.view_as_complex(x[0].reshape(f * h * w, x.shape[2], -1, 2))
    table = torch.cat(
        [
            freqs[0][frame_positions].view(f, 1, 1, -1).expand(f, h, w, -1),
            freqs[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
            freqs[2][:w].view(1, 1, w, -1).expand(f, h, w, -1),
        ],
        dim=-1,
    ).reshape(f * h * w, 1, -1)
    return torch.view_as_real(xc * table).flatten(2)[None]


def reference(q, k, v, grid, w1, w2, g1, g2, clip):
    """The authors' VRPR attention on un-rotated ``q, k, v [1, L, H, D]`` fp64 -> ``[1, L, H, D]``."""
    f, h, w = grid
    tokens = h * w
    freqs = wan_freqs(q.shape[-1])
    pos = torch.arange(f)
    q1 = (pos // g1 + w1 - w1 / g1).to(torch.long)
    k1 = pos // g1
    q3 = torch.clip(pos // g2 + w2 - w2 // g2 - (w2 - w1) // g1, max=clip)
    k3 = pos // g2
    pairs = [(pos, pos), (q1, k1), (k1, q1), (q3, k3), (k3, q3)]
    round128 = lambda n: math.ceil(n / 128) * 128  # noqa: E731
    W1, W2 = round128(tokens * w1), round128(tokens * w2)
    d = torch.arange(f * tokens)[:, None] - torch.arange(f * tokens)[None, :]
    masks = [
        d.abs() <= (w1 - 1) * tokens,  # flash_attn_func(window_size=[diag, diag])
        (d >= W1) & (d < W2),  # mask_mod_2
        (d > -W2) & (d <= -W1),  # mask_mod_3
        d >= W2,  # mask_mod_1
        d <= -W2,  # mask_mod_4
    ]
    outs, lses = [], []
    for (qp, kp), mask in zip(pairs, masks):
        qb, kb = (rope_at(t, grid, freqs, p).transpose(1, 2) for t, p in ((q, qp), (k, kp)))
        s = (qb @ kb.transpose(-1, -2)) * q.shape[-1] ** -0.5
        s = s.masked_fill(~mask, -math.inf)
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        outs.append(p @ v.transpose(1, 2))
        lses.append(lse)
    lse = torch.stack(lses)
    weights = torch.exp(lse - lse.max(0).values)
    weights = weights / weights.sum(0)
    return (torch.stack(outs) * weights[..., None]).sum(0).transpose(1, 2)


def wan_shift(head_dim):
    """``shift(x, frames)``: Wan's time pairs rotated ``frames`` further (complex pairs, fp64)."""
    time_pairs = wan_freqs(head_dim)[0].shape[1]
    omega = 1.0 / 10000.0 ** (torch.arange(0, 2 * time_pairs, 2, dtype=torch.float64) / (2 * time_pairs))

    def shift(x, frames):
        phase = torch.zeros(x.shape[1], head_dim // 2, dtype=torch.float64)
        phase[:, :time_pairs] = frames.double()[:, None] * omega
        xc = torch.view_as_complex(x.reshape(*x.shape[:3], -1, 2).contiguous())
        return torch.view_as_real(xc * torch.polar(torch.ones_like(phase), phase)[:, None]).flatten(3)

    return shift


def _qkv(length, heads=2, dim=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, length, heads, dim, generator=gen, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize(
    "grid, train, w1, w2, g1, g2",
    [((12, 4, 8), 6, 4, 6, 2, 3), ((16, 4, 5), 7, 3, 8, 2, 3), ((11, 2, 8), 5, 2, 4, 2, 2)],
)
def test_kernel_bands_equal_the_authors_code_in_fp64(grid, train, w1, w2, g1, g2):
    q, k, v = _qkv(grid[0] * grid[1] * grid[2])
    ref = reference(q, k, v, grid, w1, w2, g1, g2, clip=train - 1)
    freqs = wan_freqs(q.shape[-1])
    stock = torch.arange(grid[0])
    q_rot, k_rot = rope_at(q, grid, freqs, stock), rope_at(k, grid, freqs, stock)
    rule = FrameReencoding(train, w1, w2, g1, g2, bands="kernel")
    ours = rule.attend(q_rot, k_rot, v, grid[1] * grid[2], wan_shift(q.shape[-1]), block=50)
    assert (ours - ref).abs().max() < 1e-12
    plain = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q_rot, k_rot, v)))
    assert (ours - plain.transpose(1, 2)).abs().max() > 1e-3  # the rule changes the output


def test_near_window_over_the_whole_video_is_plain_attention():
    grid = (6, 3, 4)
    q, k, v = _qkv(72)
    rule = FrameReencoding(train_frames=3, near_frames=6, far_frames=7)
    ours = rule.attend(q, k, v, 12, wan_shift(24))
    plain = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
    assert grid[0] * grid[1] * grid[2] == 72 and (ours - plain.transpose(1, 2)).abs().max() < 1e-12


@pytest.mark.parametrize("train, scale", [(21, 2), (21, 4), (9, 2), (9, 4), (13, 3)])
def test_every_relative_time_position_stays_in_the_training_range(train, scale):
    """The paper's aim: no query/key pair sees a temporal distance the model was not trained on."""
    frames = (train - 1) * scale + 1
    rule = FrameReencoding.scaled(train)
    positions = rule.positions(torch.arange(frames))
    tokens = torch.arange(frames)  # one token a frame: the frame bands
    bands = rule.band(tokens, tokens, 1)
    relative = torch.zeros(frames, frames, dtype=torch.long)
    for band, (q_at, k_at) in positions.items():
        relative = torch.where(bands == band, q_at[:, None] - k_at[None, :], relative)
    distance = tokens[:, None] - tokens[None, :]
    assert relative.abs().max() <= train - 1 < distance.abs().max()
    assert bool((relative.sign() == distance.sign()).all())  # the order of the frames is kept
    near = distance.abs() < rule.near_frames
    assert torch.equal(relative[near], distance[near])  # stock positions near the query


def test_authors_wan_setting_is_the_scaled_default_at_21_frames():
    rule = FrameReencoding.scaled(21)
    assert (rule.near_frames, rule.far_frames, rule.near_group, rule.far_group_at(81)) == (10, 14, 2, 8)
    assert rule.far_group_at(174) == 8 and rule.far_group_at(175) == 9  # then raised to keep the order


def test_a_fixed_far_group_loses_the_order_past_its_length():
    """The authors' clip: with ``g2`` fixed, a far enough key's group passes the clipped query position."""
    rule = FrameReencoding(9, 4, 6, 2, far_group=3)
    positions = rule.positions(torch.arange(33))
    q_at, k_at = positions[3]  # FAR_AFTER
    assert int(q_at[32] - k_at[26]) <= 0


def test_active_only_past_the_training_length():
    rule = FrameReencoding.scaled(21)
    assert not rule.active(21 * 1560, 1560) and rule.active(22 * 1560, 1560)


@pytest.mark.parametrize(
    "options",
    [dict(train_frames=0, near_frames=2, far_frames=3), dict(train_frames=5, near_frames=3, far_frames=3),
     dict(train_frames=5, near_frames=2, far_frames=3, bands="tokens"), dict(train_frames=5, near_frames=2.0, far_frames=3),
     dict(train_frames=1, near_frames=2, far_frames=3)],
)  # fmt: skip
def test_bad_options_are_named(options):
    with pytest.raises(ValueError, match="train_frames|near_frames|bands"):
        FrameReencoding(**options)
