"""Properties of the HiDream, Kandinsky 6 and LTX-Video family tables the conformance suite does not reach: positions
beyond Kandinsky 6's 128-entry buffers, and LTX's mapping of mmpos' ladder onto its fractional-coordinate frequencies
(fp64 references written from the stock formulas)."""

import math

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES


def _ltx_reference(count, theta, rows, cols, frames, scale, divide):
    """fp64 LTX phases ``[S, 3, F]``: ``w_j / divide[a] * (2 g - 1)``, ``g = index * scale[a] / base[a]``."""
    w = math.pi / 2 * theta ** torch.linspace(0, 1, count, dtype=torch.float64)
    grid = torch.cartesian_prod(torch.arange(frames), torch.arange(rows), torch.arange(cols)).double()
    g = grid * torch.tensor(scale, dtype=torch.float64) / torch.tensor([20.0, 2048.0, 2048.0], dtype=torch.float64)
    return (2 * g - 1)[:, :, None] * w / torch.tensor(divide, dtype=torch.float64)[:, None]


def _ltx_seam(preset):
    case = CASES["ltx"]
    model = case.model()
    set_pe(model, "native", extrapolation=model_extrapolation(model, preset, case.grid))
    return model, position_module(model), case


def _ltx_phases(seam, inputs):
    """The seam's cos table, back to per-axis phases' cosines ``[S, 3, F]`` (padding and repeats dropped)."""
    cos, _ = seam(
        inputs["hidden_states"],
        inputs["num_frames"],
        inputs["height"],
        inputs["width"],
        inputs["rope_interpolation_scale"],
    )
    pad = cos.shape[-1] % 6
    return cos[0, :, pad::2].reshape(cos.shape[1], -1, 3).transpose(1, 2).double()


def test_kandinsky6_positions_beyond_the_stock_buffers_are_computed():
    case = CASES["kandinsky6"]
    model = case.model()
    pos = (torch.arange(1), torch.arange(200), torch.arange(3))
    with pytest.raises(IndexError):
        model.visual_rope_embeddings(pos, model.scale_factor)  # the stock wall at 128 positions
    set_pe(model, "native")
    table = position_module(model)(pos, model.scale_factor)
    assert table.shape == (1, 200, 3, 1, 8, 2, 2)
    dims, sf = (8, 4, 4), model.scale_factor
    phases = []
    for axis, (d, p) in enumerate(zip(dims, pos)):
        inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        phases.append(torch.outer(p.double(), inv) / sf[axis])
    row = phases[1]  # [200, 2]: rows' pairs are channels 4:6 of the pair axis
    got = table[0, :, 0, 0, 4:6]
    assert torch.allclose(got[..., 0, 0].double(), row.cos(), atol=1e-4)
    assert torch.allclose(got[..., 1, 0].double(), row.sin(), atol=1e-4)
    assert torch.equal(got[..., 0, 1], -got[..., 1, 0])


def test_ltx_position_interpolation_divides_every_image_frequency():
    model, seam, case = _ltx_seam("pi")
    rows, cols = (2 * v for v in case.grid)
    inputs = case.inputs(rows, cols)
    count = seam.axes_dims[0] // 2
    expected = _ltx_reference(count, 10000.0, rows, cols, 2, inputs["rope_interpolation_scale"], (1.0, 2.0, 2.0))
    assert torch.allclose(_ltx_phases(seam, inputs), expected.cos(), atol=5e-3)  # f32 phases up to 1e4 rad
