"""CRPA (arXiv 2511.19778): mixed-resolution positions on the query's stride (mmpos.coords.phase_aligned) and the
attention that uses them (mmpos.ops.phase_aligned_attention). No code is public: the paper's stated properties,
and an fp64 reference written from its definition (each query's logits with q and k rotated at centre / its stride,
explicit cos/sin, explicit softmax)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mmpos.coords import image_grid
from mmpos.coords.phase_aligned import MixedGrid, mixed_resolution_grid, phase_aligned_positions
from mmpos.encodings import AxialRoPE
from mmpos.ops.phase_aligned_attention import phase_aligned_attention
from tests.fixtures.explicit_rope import HEAD_DIM, THETA, rotate_explicit


def _qkv(length, heads=2, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(1, length, heads, HEAD_DIM, generator=gen, dtype=dtype) for _ in range(3))


def _encoding():
    return AxialRoPE(HEAD_DIM, axes_dims=(8, 8), theta=THETA, seq_dim=-3, table_precision="fp64")


def crpa_reference(q, k, v, grid: MixedGrid):
    """Query by query: every token at ``centre / stride(query)``, rotated, softmax(q k / sqrt(D)) v."""
    out = torch.empty_like(q)
    for i in range(q.shape[1]):
        positions = grid.centres / grid.strides[i]
        qi = rotate_explicit(q[0, i : i + 1], positions[i : i + 1])[0]  # [H, D]
        kr = rotate_explicit(k[0], positions)  # [L, H, D]
        logits = torch.einsum("hd,lhd->hl", qi, kr) / math.sqrt(HEAD_DIM)
        out[0, i] = torch.einsum("hl,lhd->hd", torch.softmax(logits, dim=-1), v[0])
    return out


def test_without_a_fine_region_the_grid_is_the_stock_grid_bit_for_bit():
    grid = mixed_resolution_grid(5, 7, None, factor=2)
    assert torch.equal(phase_aligned_positions(grid, 1.0), image_grid(5, 7))
    q, k, v = _qkv(35, dtype=torch.float32)
    pe = _encoding()
    rq, rk = pe(q, k, image_grid(5, 7))
    stock = F.scaled_dot_product_attention(rq.transpose(1, 2), rk.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    assert torch.equal(phase_aligned_attention(q, k, v, grid, pe), stock)


def test_fine_cells_tile_the_coarse_cells_they_replace():
    grid = mixed_resolution_grid(4, 6, (1, 2, 2, 3), factor=3)
    assert len(grid.strides) == 4 * 6 - 2 * 3 + 9 * 2 * 3
    fine = grid.centres[grid.strides < 1]
    # the fine centres average to the centre of the replaced coarse block: rows 1..2 -> 1.5, cols 2..4 -> 3
    assert torch.allclose(fine.mean(0), torch.tensor([1.5, 3.0], dtype=torch.float64), atol=1e-12)
    assert fine[:, 0].min() == pytest.approx(0.5 + 1 / 6) and fine[:, 1].max() == pytest.approx(4.5 - 1 / 6)


def test_equal_physical_distance_gives_each_grid_its_own_phase_step():
    """The paper's property: a neighbour one cell away is one RoPE step away for coarse and fine queries alike;
    linear interpolation onto the fine grid puts the coarse neighbour ``factor`` steps away."""
    factor = 4
    grid = mixed_resolution_grid(6, 6, (2, 2, 2, 2), factor=factor)
    coarse = (grid.strides == 1).nonzero().squeeze(1)
    fine = (grid.strides < 1).nonzero().squeeze(1)
    a, b = coarse[0], coarse[1]  # (0, 0) and (0, 1): one coarse cell apart
    c, d = fine[0], fine[1]  # one fine cell apart
    crpa_coarse = phase_aligned_positions(grid, 1.0, torch.float64)
    crpa_fine = phase_aligned_positions(grid, 1 / factor, torch.float64)
    assert (crpa_coarse[b] - crpa_coarse[a]).tolist() == [0.0, 1.0]
    assert (crpa_fine[d] - crpa_fine[c]).tolist() == pytest.approx([0.0, 1.0])
    linear = phase_aligned_positions(grid, 1 / factor, torch.float64)  # one reference stride for every query
    assert (linear[b] - linear[a]).tolist() == [0.0, float(factor)]


@pytest.mark.parametrize("region, factor", [((1, 1, 2, 2), 2), ((0, 3, 3, 2), 3), ((2, 0, 1, 4), 2)])
def test_attention_equals_the_definition_in_fp64(region, factor):
    grid = mixed_resolution_grid(4, 5, region, factor=factor)
    q, k, v = _qkv(len(grid.strides), seed=factor)
    ours = phase_aligned_attention(q, k, v, grid, _encoding())
    torch.testing.assert_close(ours, crpa_reference(q, k, v, grid), rtol=0, atol=1e-12)


def test_it_differs_from_linear_interpolation_onto_one_grid():
    grid = mixed_resolution_grid(4, 4, (1, 1, 2, 2), factor=2)
    q, k, v = _qkv(len(grid.strides), seed=3)
    pe = _encoding()
    ours = phase_aligned_attention(q, k, v, grid, pe)
    linear_positions = phase_aligned_positions(grid, 0.5, torch.float64)
    rq, rk = pe(q, k, linear_positions)
    linear = F.scaled_dot_product_attention(rq.transpose(1, 2), rk.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    fine = grid.strides < 1
    torch.testing.assert_close(ours[:, fine], linear[:, fine], rtol=0, atol=1e-12)  # fine queries: the same map
    assert (ours[:, ~fine] - linear[:, ~fine]).abs().max() > 1e-2  # coarse queries: their own stride


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="region"):
        mixed_resolution_grid(4, 4, (3, 3, 2, 2), factor=2)
    with pytest.raises(ValueError, match="factor"):
        mixed_resolution_grid(4, 4, None, factor=0)
    with pytest.raises(ValueError, match="query_stride"):
        phase_aligned_positions(mixed_resolution_grid(2, 2, None, 2), 0.0)
    with pytest.raises(ValueError, match="strides"):
        MixedGrid(torch.zeros(3, 2), torch.zeros(2))
    q, k, v = _qkv(5)
    with pytest.raises(ValueError, match="grid's 4 tokens"):
        phase_aligned_attention(q, k, v, mixed_resolution_grid(2, 2, None, 2), _encoding())
