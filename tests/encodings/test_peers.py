"""Equivalence with the peers' own code (diffusers, timm, transformers, rotary-embedding-torch)."""

import pytest
import torch

import mmpos
from mmpos.coords import flux_ids, image_grid, video_grid


def _assert_close_fp32(actual, expected, ulps=4):
    """Equal up to a few fp32 roundings of the operands' magnitude."""
    tol = ulps * torch.finfo(torch.float32).eps * (expected.abs() + 1)
    assert ((actual - expected).abs() <= tol).all(), (actual - expected).abs().max()


class TestDiffusersFlux:
    def setup_method(self):
        from diffusers.models.transformers.transformer_flux import FluxPosEmbed

        self.ids = flux_ids(6, 5, text_length=7, index=1.0)
        self.cos, self.sin = FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])(self.ids)
        self.pe = mmpos.create_pe("rope_axial", head_dim=128, axes_dims=(16, 56, 56), theta=10000, layout="interleaved")

    def test_tables_are_bit_identical(self):
        table = self.pe.table(self.ids, torch.float32)
        assert torch.equal(table.cos, self.cos[:, 0::2])
        assert torch.equal(table.sin, self.sin[:, 0::2])

    @pytest.mark.parametrize("seq_dim", [-2, -3])
    def test_apply_matches_apply_rotary_emb(self, seq_dim):
        from diffusers.models.embeddings import apply_rotary_emb

        pe = mmpos.create_pe("rope_axial", head_dim=128, axes_dims=(16, 56, 56), seq_dim=seq_dim)
        shape = (2, 3, 37, 128) if seq_dim == -2 else (2, 37, 3, 128)
        q, k = torch.randn(shape), torch.randn(shape)
        q_ours, k_ours = pe(q, k, self.ids)
        sequence_dim = 2 if seq_dim == -2 else 1
        _assert_close_fp32(q_ours, apply_rotary_emb(q, (self.cos, self.sin), sequence_dim=sequence_dim))
        _assert_close_fp32(k_ours, apply_rotary_emb(k, (self.cos, self.sin), sequence_dim=sequence_dim))


def test_diffusers_wan_tables_and_apply():
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    head_dim, frames, height, width = 128, 3, 4, 6
    wan = WanRotaryPosEmbed(head_dim, patch_size=(1, 2, 2), max_seq_len=64)
    cos, sin = wan(torch.zeros(1, 4, frames, 2 * height, 2 * width))  # [1, L, 1, D]
    pe = mmpos.create_pe("rope_axial", head_dim=head_dim, num_axes=3, seq_dim=-3)
    assert pe.axes_dims == (44, 42, 42)
    coords = video_grid(frames, height, width)
    table = pe.table(coords, torch.float32)
    assert torch.equal(table.cos, cos[0, :, 0, 0::2].float())
    assert torch.equal(table.sin, sin[0, :, 0, 1::2].float())
    q = torch.randn(2, frames * height * width, 3, head_dim)  # Wan's [B, L, H, D]
    expected = apply_rotary_emb(q, (cos[0, :, 0].float(), sin[0, :, 0].float()), sequence_dim=1)
    _assert_close_fp32(pe(q, q, coords)[0], expected)


def test_timm_axial_rotary_embedding_cat():
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, apply_rot_embed_cat

    head_dim, shape = 64, (5, 7)
    timm_rope = RotaryEmbeddingCat(head_dim, temperature=100.0, in_pixels=False, feat_shape=list(shape))
    emb = timm_rope.get_embed()
    pe = mmpos.create_pe("rope_axial", head_dim=head_dim, theta=100.0, layout="interleaved")
    x = torch.randn(2, 4, shape[0] * shape[1], head_dim)
    _assert_close_fp32(pe(x, x, image_grid(*shape))[0], apply_rot_embed_cat(x, emb), ulps=64)


def test_timm_rope_mixed():
    from timm.layers.pos_embed_sincos import RotaryEmbeddingMixed, apply_rot_embed_cat

    heads, head_dim, depth, shape = 3, 32, 2, (4, 6)
    timm_rope = RotaryEmbeddingMixed(heads * head_dim, depth=depth, num_heads=heads, feat_shape=list(shape))
    emb = timm_rope.get_embed()  # [depth, H, N, 2 * head_dim]
    t_x, t_y = timm_rope.t_x, timm_rope.t_y
    coords = torch.stack([t_x, t_y], dim=-1)
    x = torch.randn(2, heads, shape[0] * shape[1], head_dim)
    for layer in range(depth):
        pe = mmpos.create_pe("rope_mixed", head_dim=head_dim, num_heads=heads)
        with torch.no_grad():
            pe.freqs.copy_(timm_rope.freqs[:, layer].permute(1, 0, 2))
        _assert_close_fp32(pe(x, x, coords)[0], apply_rot_embed_cat(x, emb[layer]), ulps=64)


def _llama(rope_parameters, head_dim=32):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=256,
        rope_parameters=rope_parameters,
    )
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize(
    "extrapolation,rope_parameters",
    [
        (None, {"rope_type": "default", "rope_theta": 10000.0}),
        ({"type": "pi", "factor": 4.0}, {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
        (
            {"type": "yarn", "factor": 4.0, "original_length": 64},
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0},
        ),
    ],
)
def test_transformers_rotate_half(extrapolation, rope_parameters):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rotary = _llama(rope_parameters)
    positions = torch.tensor([[0, 3, 17, 200, 511]])
    q, k = torch.randn(1, 2, 5, 32), torch.randn(1, 2, 5, 32)
    cos, sin = rotary(q, positions)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    pe = mmpos.create_pe("rope_1d", head_dim=32, layout="half", extrapolation=extrapolation)
    q_ours, k_ours = pe(q, k, positions[0].float())
    _assert_close_fp32(q_ours, q_ref, ulps=512)  # transformers builds phases in fp32: ~1e-5 rad at 511
    _assert_close_fp32(k_ours, k_ref, ulps=512)
    spectrum_freq = pe.spectrum.inv_freq.float()
    assert torch.allclose(spectrum_freq, rotary.inv_freq, rtol=1e-6, atol=0)
    assert pe.spectrum.magnitude[0].item() == pytest.approx(rotary.attention_scaling, rel=1e-12)


def test_rotary_embedding_torch_interleaved():
    from rotary_embedding_torch import RotaryEmbedding

    peer = RotaryEmbedding(dim=32)
    x = torch.randn(2, 3, 50, 32)
    pe = mmpos.create_pe("rope_1d", head_dim=32, layout="interleaved")
    _assert_close_fp32(pe(x, x)[0], peer.rotate_queries_or_keys(x), ulps=64)


def test_partial_rotary_matches_neox_style_partial_rotation():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rotary = _llama({"rope_type": "default", "rope_theta": 10000.0}, head_dim=16)  # NeoX: rotate first 16 of 32
    positions = torch.arange(9)[None]
    q = torch.randn(1, 2, 9, 32)
    cos, sin = rotary(q, positions)  # [1, 9, 16]
    q_rot, q_pass = q[..., :16], q[..., 16:]
    expected = torch.cat([apply_rotary_pos_emb(q_rot, q_rot, cos, sin)[0], q_pass], dim=-1)
    pe = mmpos.create_pe("rope_1d", head_dim=32, rotary_dim=16, layout="half")
    _assert_close_fp32(pe(q, q)[0], expected, ulps=64)
