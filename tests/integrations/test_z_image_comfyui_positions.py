"""ComfyUI-DyPE's Z-Image positions (``convention="comfyui"`` on Z-Image) against its formula re-implemented here in
fp64 from ComfyUI-DyPE v2.3.0 ``src/patch_utils.py`` ``dype_patchify_and_embed`` (image rows and columns at the
stride ``latent pixels per token * base resolution / max(height, width)`` in pixels) and ``src/models/zimage.py``
``_resize_rope_grid`` (blended back to the integer grid by ``1 - t ** dype_exponent``); the seam computes its tables
at those fractional positions; every other convention keeps the integer ids."""

import math

import pytest
import torch

from mmpos.integrations.diffusers import DyPEConfig, apply_dype, position_module, set_pe
from mmpos.integrations.diffusers.families import z_image
from mmpos.integrations.diffusers.families.tiny import CASES

PIXELS_PER_LATENT, PATCH = 8, 2


def port_positions(rows, cols, base_tokens, t, exponent=2.0, start_sigma=1.0, padding=0):
    """The port's (row, col) per image token, row-major, then ``padding`` tokens at (0, 0) as diffusers pads them."""
    height, width = rows * PATCH * PIXELS_PER_LATENT, cols * PATCH * PIXELS_PER_LATENT  # requested pixels
    base_resolution = base_tokens * PATCH * PIXELS_PER_LATENT
    latent_h, latent_w = height // PIXELS_PER_LATENT, width // PIXELS_PER_LATENT
    iso = min(base_resolution / max(1.0, height), base_resolution / max(1.0, width))
    h_tokens, w_tokens = math.ceil(latent_h / PATCH), math.ceil(latent_w / PATCH)
    stride_y, stride_x = latent_h / h_tokens * iso, latent_w / w_tokens * iso
    k = torch.arange(h_tokens * w_tokens, dtype=torch.float64)
    pos = torch.stack(
        [torch.div(k, w_tokens, rounding_mode="floor") * stride_y, torch.remainder(k, w_tokens) * stride_x], 1
    )
    pos = torch.cat([pos, torch.zeros(padding, 2, dtype=torch.float64)])
    t_norm = 1.0 if t > start_sigma else t / start_sigma
    blend = 1.0 - t_norm**exponent
    if blend <= 0.001:
        return pos
    mask = (pos[:, 0] != 0) | (pos[:, 1] != 0)
    out = pos.clone()
    for axis in (0, 1):
        coords = pos[:, axis]
        unique = torch.sort(torch.unique(coords[mask])).values
        if unique.numel() <= 1:
            continue
        step = torch.median(torch.diff(unique))
        if torch.isclose(step, torch.tensor(1.0, dtype=torch.float64), atol=1e-3) or torch.isclose(
            step, torch.tensor(0.0, dtype=torch.float64)
        ):
            continue
        start = coords[mask].min()
        out[:, axis] = coords + ((coords - start) / step + start - coords) * blend
    return out


def image_ids(rows, cols, caption=32, padding=0):
    """Z-Image's image ids ``(caption + 1, row, col)`` and its padding ``(0, 0, 0)``."""
    grid = torch.cartesian_prod(torch.tensor([caption + 1]), torch.arange(rows), torch.arange(cols))
    return torch.cat([grid, torch.zeros(padding, 3, dtype=grid.dtype)]).int()


@pytest.mark.parametrize("rows, cols", [(128, 128), (96, 160), (64, 64), (200, 90), (1, 130), (130, 1), (2, 300)])
@pytest.mark.parametrize("t", [1.0, 0.97, 0.6, 0.25, 0.0])
@pytest.mark.parametrize("base, exponent, start_sigma", [(64, 2.0, 1.0), (48, 3.0, 0.8)])
def test_positions_are_comfyui_dypes_formula(rows, cols, t, base, exponent, start_sigma):
    padding = (-rows * cols) % 32
    ids = image_ids(rows, cols, padding=padding)
    ours = z_image.comfyui_positions(ids, base, t, exponent, start_sigma)
    reference = port_positions(rows, cols, base, t, exponent, start_sigma, padding)
    torch.testing.assert_close(ours[:, 1:], reference, rtol=1e-12, atol=1e-12)
    assert torch.equal(ours[:, 0], ids[:, 0].double())  # the index axis as it is


def test_positions_compress_at_high_noise_and_reach_the_integer_grid_at_zero():
    ids = image_ids(256, 128)
    start = z_image.comfyui_positions(ids, 64, 1.0)
    end = z_image.comfyui_positions(ids, 64, 0.0)
    assert start[:, 1].max() == pytest.approx(255 * 0.5)  # 2 * 64 / 256: half a token per row at sigma 1
    torch.testing.assert_close(end[:, 1:], ids[:, 1:].double(), rtol=0, atol=1e-12)
    assert z_image.comfyui_positions(ids, 64, None)[:, 1].max() == pytest.approx(255 * 0.5)  # DyPE off: no blend


def tiny(convention):
    case = CASES["z_image"]
    model = case.model()
    apply_dype(model, DyPEConfig(trained_grid=case.grid, convention=convention))
    return model, position_module(model)


def test_the_seam_computes_its_tables_at_the_ports_positions():
    """Z-Image's table at ComfyUI-DyPE's fractional positions: ``polar(magnitude, position * inv_freq)`` per axis
    (the spectrum: the schedule's, tested against the port elsewhere), the index axis at its integer ids."""
    model, seam = tiny("comfyui")
    (encoding,) = seam.encodings
    rows, cols, sigma = 12, 6, 0.5
    encoding.step.sigma = sigma
    ids = image_ids(rows, cols, caption=32, padding=(-rows * cols) % 32)
    table = seam(ids)
    schedule = encoding.schedule
    spectrum = schedule.spectrum(schedule.policies([33.0, rows, cols], sigma))
    positions = torch.cat(
        [
            ids[:, :1].double(),
            port_positions(rows, cols, max(CASES["z_image"].grid), sigma, padding=ids.shape[0] - rows * cols),
        ],
        1,
    )
    parts, start = [], 0
    for axis, dim in enumerate(seam.axes_dims):
        inv, magnitude = spectrum.inv_freq[start : start + dim // 2], spectrum.magnitude[start : start + dim // 2]
        phases = torch.outer(positions[:, axis], inv.double()).float()
        parts.append(torch.polar(magnitude.float().expand_as(phases).contiguous(), phases))
        start += dim // 2
    expected = torch.cat(parts, dim=-1)
    torch.testing.assert_close(table, expected, rtol=1e-5, atol=1e-5)
    _, authors = tiny("authors")
    authors.encodings[0].step.sigma = sigma
    assert (table - authors(ids)).abs().max() > 1e-2  # the rows and columns moved


@pytest.mark.parametrize("convention", ["authors", "native"])
def test_other_conventions_keep_the_integer_ids(monkeypatch, convention):
    """The authors' DyPE and native never compute the port's positions (their tables: the integer-id rows)."""

    def refuse(*args, **kwargs):
        raise AssertionError("comfyui positions computed outside convention='comfyui'")

    monkeypatch.setattr(z_image, "comfyui_positions", refuse)
    case = CASES["z_image"]
    model = case.model()
    if convention == "native":
        set_pe(model, "native")
    else:
        apply_dype(model, DyPEConfig(trained_grid=case.grid, convention=convention))
    with torch.no_grad():
        model(**case.inputs(8, 6, sigma=0.5), return_dict=False)


def test_the_comfyui_convention_through_mmpos_processors_is_refused_by_name():
    case = CASES["z_image"]
    config = DyPEConfig(trained_grid=case.grid, convention="comfyui", pe="rope_axial")
    model, stock = case.model(), case.model()
    with pytest.raises(ValueError, match="convention='comfyui'.*native seam only"):
        apply_dype(model, config)
    with torch.no_grad():  # nothing left installed
        out, expected = (m(**case.inputs(6, 4), return_dict=False)[0][0] for m in (model, stock))
    assert torch.equal(out, expected)
