"""bf16 results stay within 1 bf16 ulp of the rotation computed in fp64 from fp64 tables."""

import pytest
import torch

import mmpos
from mmpos.coords import image_grid
from mmpos.ops import axial_phases
from tests.conftest import bf16_ulp


def _exact(pe, x, coords):
    """Rotation in fp64 arithmetic from fp64 phases (the reference)."""
    return pe.double()(x.double(), x.double(), coords.double())[0]


def _max_ulps(pe, x, coords):
    reference = _exact(pe, x, coords)
    return ((pe.float()(x, x, coords)[0].double() - reference).abs() / bf16_ulp(reference)).max().item()


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("table_precision", ["fp64", "fp32_reduced"])
def test_1d_positions_up_to_1e6(layout, table_precision):
    pe = mmpos.create_pe("rope_1d", head_dim=64, layout=layout, table_precision=table_precision)
    positions = torch.cat(
        [torch.arange(0, 2048.0), torch.linspace(2048, 1e6, 2048).round(), torch.tensor([999_999.0, 1e6])]
    )
    x = torch.randn(1, 4, positions.numel(), 64).bfloat16()
    assert _max_ulps(pe, x, positions) <= 1.0


@pytest.mark.parametrize("table_precision", ["fp64", "fp32_reduced"])
def test_grids_up_to_1024_per_axis(table_precision):
    pe = mmpos.create_pe("rope_axial", head_dim=64, table_precision=table_precision)
    rows = torch.tensor([0, 1, 511, 700, 1023.0])
    coords = torch.cartesian_prod(rows, torch.arange(0, 1024.0, 7))
    x = torch.randn(2, 3, coords.shape[0], 64).bfloat16()
    assert _max_ulps(pe, x, coords) <= 1.0


def test_naive_fp32_phases_break_the_bound():
    """The test of the test: a plain fp32 position x frequency product misses the bound at 1e6."""
    pe = mmpos.create_pe("rope_1d", head_dim=64)
    positions = torch.linspace(9e5, 1e6, 512).round()
    x = torch.randn(1, 2, 512, 64).bfloat16()
    naive_phase = positions[:, None] * pe.spectrum.inv_freq.float()
    exact_phase = axial_phases(positions[:, None], pe.spectrum.axis_of_pair, pe.spectrum.inv_freq)
    assert (naive_phase.double() - exact_phase).abs().max() > 0.01
    from mmpos.ops import RotaryTable, rotate

    naive = rotate(x, RotaryTable(torch.polar(torch.ones_like(naive_phase), naive_phase)), "half")
    reference = _exact(pe, x, positions)
    assert ((naive.double() - reference).abs() / bf16_ulp(reference)).max() > 1.0


def test_fp16_is_correctly_rounded_too():
    pe = mmpos.create_pe("rope_axial", head_dim=32)
    coords = image_grid(32, 32)
    x = torch.randn(1, 2, 1024, 32).half()
    reference = _exact(pe, x, coords)
    spacing = 2.0 ** (torch.floor(torch.log2(reference.abs().clamp_min(2.0**-14))) - 10)
    assert ((pe(x, x, coords)[0].double() - reference).abs() / spacing).max() <= 1.0
