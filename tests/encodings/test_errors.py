"""Bad input gets an error that names the argument and what was expected."""

import pytest
import torch

import mmpos
from mmpos.coords import image_grid


@pytest.mark.parametrize(
    "options,match",
    [
        (dict(head_dim=31), "rotary_dim must be a non-negative even"),
        (dict(head_dim=64, axes_dims=(16, 17)), r"axes_dims\[1\]"),
        (dict(head_dim=64, axes_dims=(16, 16), rotary_dim=64), "add up to 32, not rotary_dim=64"),
        (dict(head_dim=32, axes_dims=(16, 16, 16)), "exceed head_dim=32"),
        (dict(head_dim=64, layout="diagonal"), "layout='diagonal'"),
        (dict(head_dim=64, allocation="zigzag"), "allocation='zigzag'"),
        (dict(head_dim=64, axes_dims=(8, 28, 28), allocation="interleaved"), "axis 1 needs pair index"),
        (dict(head_dim=64, extrapolation={"type": "warp"}), "extrapolation type 'warp'"),
        (dict(head_dim=64, extrapolation={"type": "ntk", "factor": -1}), "NTKAware.factor"),
        (dict(head_dim=64, theta=(100.0, 100.0, 100.0)), "theta has 3 entries"),
        (dict(head_dim=64, pair_scale=[1.0] * 3), "pair_scale has 3 entries"),
    ],
)
def test_bad_rope_axial_options(options, match):
    with pytest.raises((ValueError, TypeError), match=match):
        mmpos.create_pe("rope_axial", **options)


def test_unknown_and_missing_options_are_named():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['thetta'\]"):
        mmpos.create_pe("rope_axial", head_dim=64, thetta=100)
    with pytest.raises(TypeError, match=r"missing required option\(s\) \['head_dim'\]"):
        mmpos.create_pe("rope_axial")
    with pytest.raises(ValueError, match="unknown encoding 'rope_magic'"):
        mmpos.create_pe("rope_magic")


@pytest.fixture
def pe():
    return mmpos.create_pe("rope_axial", head_dim=32)


def test_coordinates_with_wrong_axes(pe):
    q = torch.randn(1, 2, 6, 32)
    with pytest.raises(ValueError, match=r"coords has shape \(6, 3\); expected \[L, 2\]"):
        pe(q, q, torch.zeros(6, 3))


def test_coordinates_with_wrong_length(pe):
    q = torch.randn(1, 2, 6, 32)
    with pytest.raises(ValueError, match="table has 5 positions but x has 6 tokens"):
        pe(q, q, image_grid(1, 5))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_coordinates(pe, bad):
    coords = image_grid(2, 3)
    coords[4, 1] = bad
    q = torch.randn(1, 2, 6, 32)
    with pytest.raises(ValueError, match="coords contains 1 non-finite"):
        pe(q, q, coords)


def test_16bit_coordinates_are_refused(pe):
    q = torch.randn(1, 2, 6, 32)
    with pytest.raises(TypeError, match="positions must be float32 or float64"):
        pe(q, q, image_grid(2, 3).bfloat16())


def test_wrong_head_dim_and_mismatched_q_k(pe):
    with pytest.raises(ValueError, match="head_dim=32"):
        pe(torch.randn(1, 2, 6, 64), torch.randn(1, 2, 6, 64), image_grid(2, 3))
    with pytest.raises(ValueError, match="must share head dim and sequence length"):
        pe(torch.randn(1, 2, 6, 32), torch.randn(1, 2, 5, 32), image_grid(2, 3))


def test_rope_1d_odd_rotary_dim_and_mixed_head_dim():
    with pytest.raises(ValueError, match="even"):
        mmpos.create_pe("rope_1d", head_dim=64, rotary_dim=15)
    with pytest.raises(ValueError, match="multiple of 4"):
        mmpos.create_pe("rope_mixed", head_dim=34, num_heads=2)


def test_coordinate_builders_validate():
    with pytest.raises(ValueError, match="mode='polar'"):
        image_grid(2, 2, mode="polar")
    with pytest.raises(ValueError, match="size must be a positive integer"):
        image_grid(0, 2)
    with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
        image_grid(2, 2, dtype=torch.bfloat16)


def test_per_head_table_refuses_fewer_heads_than_it_has():
    pe = mmpos.create_pe("rope_mixed", head_dim=32, num_heads=4)
    q = torch.randn(1, 1, 6, 32)
    with pytest.raises(ValueError, match=r"table leading dims \(4,\)"):
        pe(q, q, image_grid(2, 3))
