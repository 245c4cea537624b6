"""Absolute encodings: sin-cos against diffusers, learned lookup and resampling against timm."""

import torch

import mmpos
from mmpos.coords import grid_coords, image_grid


def test_sincos_2d_matches_diffusers():
    from diffusers.models.embeddings import get_2d_sincos_pos_embed

    expected = get_2d_sincos_pos_embed(64, (6, 6), base_size=6, output_type="pt")
    pe = mmpos.create_pe("ape_sincos", embed_dim=64)
    col_row = image_grid(6, 6)[:, [1, 0]]  # diffusers/MAE encode the column axis first
    assert torch.allclose(pe.embed(col_row), expected.float(), atol=1e-6, rtol=0)


def test_sincos_3d_and_prefix_untouched():
    pe = mmpos.create_pe("ape_sincos", embed_dim=48, num_axes=3, num_prefix_tokens=1)
    x = torch.randn(2, 1 + 2 * 3 * 4, 48)
    out = pe(x, grid_coords((2, 3, 4)))
    assert torch.equal(out[:, 0], x[:, 0])
    assert torch.allclose(out[:, 1:] - x[:, 1:], pe.embed(grid_coords((2, 3, 4))).expand(2, -1, -1), atol=1e-6)


def test_learned_lookup_and_resample_match_timm():
    from timm.layers import resample_abs_pos_embed

    pe = mmpos.create_pe("ape_learned", embed_dim=16, grid_size=(4, 5))
    coords = image_grid(4, 5)
    assert torch.equal(pe.embed(coords), pe.weight.reshape(20, 16))
    expected = resample_abs_pos_embed(
        pe.weight.reshape(1, 20, 16), new_size=[6, 8], old_size=[4, 5], num_prefix_tokens=0
    )
    assert torch.allclose(pe.resample((6, 8)), expected[0], atol=1e-6)


def test_learned_fractional_coordinates_interpolate_between_nodes():
    pe = mmpos.create_pe("ape_learned", embed_dim=8, grid_size=(3, 3))
    w = pe.weight
    mid = pe.embed(torch.tensor([[0.5, 1.0], [2.0, 1.25]]))
    assert torch.allclose(mid[0], (w[0, 1] + w[1, 1]) / 2, atol=1e-6)
    assert torch.allclose(mid[1], 0.75 * w[2, 1] + 0.25 * w[2, 2], atol=1e-6)


def test_nope_returns_inputs():
    pe = mmpos.create_pe("nope")
    q = torch.randn(1, 2, 4, 8)
    q2, k2 = pe(q, q, image_grid(2, 2))
    assert q2 is q and k2 is q
