"""HRDiT's SPA (mmpos.coords.bundles, mmpos.ops.averaged_attention) against the authors' code, written out.

The reference follows github.com/zylwithxy/HRDiT ``hrdit/spa.py`` (``_phi``, ``build_bundle_id_variants``) and the
processor's ``_spa_attention`` (one attention per bundle grid, outputs averaged), with the paper's average of
attention maps (softmax maps averaged, then times ``v``) in fp64."""

from __future__ import annotations

import math

import pytest
import torch

from mmpos.coords import image_grid
from mmpos.coords.bundles import bundle_variants
from mmpos.encodings import AxialRoPE
from mmpos.ops.averaged_attention import averaged_attention
from tests.fixtures.explicit_rope import HEAD_DIM, THETA, rotate_explicit


def reference_variants(rows_cols: torch.Tensor, group_num: int) -> list[torch.Tensor]:
    """``build_bundle_id_variants`` on int64 ``[L, 2]`` (their ids' columns 1 and 2)."""
    rows, cols = rows_cols[:, 0], rows_cols[:, 1]
    s_row = max(1, math.ceil(rows.max().item() / (group_num - 1)))
    s_col = max(1, math.ceil(cols.max().item() / (group_num - 1)))

    def phi(x, n1, size):
        return torch.where(x < n1, torch.zeros_like(x), (x + 1 - n1 + size - 1) // size)

    out = [torch.stack([phi(rows, s_row, s_row), phi(cols, s_col, s_col)], -1)]
    out += [torch.stack([phi(rows, n, s_row), phi(cols, s_col, s_col)], -1) for n in range(1, s_row)]
    out += [torch.stack([phi(rows, s_row, s_row), phi(cols, m, s_col)], -1) for m in range(1, s_col)]
    return out


@pytest.mark.parametrize("rows, cols, group_num", [(20, 37, 5), (33, 9, 8), (64, 64, 80), (160, 96, 80)])
def test_bundle_grids_equal_the_authors(rows, cols, group_num):
    grid = image_grid(rows, cols)
    ours = bundle_variants(grid, group_num)
    theirs = reference_variants(grid.long(), group_num)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == grid.dtype and torch.equal(a.long(), b)
    assert max(int(v.max()) for v in ours) <= group_num  # bundled positions stay near the trained range


def test_within_group_num_the_one_grid_is_the_stock_grid():
    grid = image_grid(64, 64)  # FLUX.1's 1024 px grid, the authors' group_num 80
    (only,) = bundle_variants(grid, 80)
    assert torch.equal(only, grid)


def test_averaged_attention_equals_the_average_of_attention_maps_in_fp64():
    grid = image_grid(7, 10)
    variants = bundle_variants(grid, 4)  # sizes 2 and 3: 1 + 1 + 2 grids
    assert len(variants) == 4
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 70, 2, HEAD_DIM, generator=gen, dtype=torch.float64) for _ in range(3))
    pe = AxialRoPE(HEAD_DIM, axes_dims=(8, 8), theta=THETA, seq_dim=-3, table_precision="fp64")
    scale = 0.3
    ours = averaged_attention(q, k, v, [pe.table(g.double(), torch.float64) for g in variants], pe, scale)
    maps = []
    for g in variants:
        qr, kr = rotate_explicit(q[0], g.double()), rotate_explicit(k[0], g.double())
        maps.append(torch.softmax(torch.einsum("lhd,mhd->hlm", qr, kr) * scale, dim=-1))
    expected = torch.einsum("hlm,mhd->lhd", torch.stack(maps).mean(0), v[0])[None]
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="group_num"):
        bundle_variants(image_grid(4, 4), 1)
    with pytest.raises(ValueError, match="integer"):
        bundle_variants(image_grid(4, 4) + 0.5, 4)
    with pytest.raises(ValueError, match="tables"):
        averaged_attention(*(torch.zeros(1, 4, 1, 16) for _ in range(3)), [], None)
