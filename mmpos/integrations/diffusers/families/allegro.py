"""Allegro (``AllegroTransformer3DModel``): the pipeline builds the rotary tables and passes them as
``forward(image_rotary_emb=((t_cos, t_sin), (h_cos, h_sin), (w_cos, w_sin)), (t_ids, h_ids, w_ids)))``
(:mod:`.rotary_input`).

``AllegroPipeline._prepare_rotary_positional_embeddings`` calls ``get_3d_rotary_pos_embed_allegro`` on the latent
token grid ``(F, H / p, W / p)`` (hidden states ``[B, C, F, H, W]``): one table per axis, row ``i`` at position
``i / interpolation_scale_a`` (the config's ``interpolation_scale_t / _h / _w``: 2.2, 2.0, 2.0 in the released
model: built-in position interpolation), ``D / 3`` channels per axis (``D`` = ``attention_head_dim``), theta 10000,
float32 ladder and phases, cos / sin of the pairs concatenated twice (``[c0 c1 ... c0 c1 ...]``: the rotate-half
layout); the integer token positions ``(t, h, w)`` ``[3, 1, F H W]`` index the tables in the processors.

The seam rebuilds the three tables (the integer positions pass through). A schedule's extents are in those
coordinate units (``n / interpolation_scale_a``), and :func:`~..extrapolation.model_extrapolation` takes the
training grid in tokens and converts it (``extras["image_coords_per_token"]``). The pipeline passes the
scheduler's discrete timesteps (0 .. 999): sigma = timestep / 1000.
"""

from __future__ import annotations

import torch

from . import register_family
from .base import check_latents
from .codecs import axis_frequencies, forward_arg
from .rotary_input import RotaryInput, fitted_positions, rotary_input_family


def axes_dims(model) -> tuple[int, int, int]:
    d = int(model.config.attention_head_dim) // 3
    return (d, d, d)


def scales(config) -> tuple[float, float, float]:
    """``(interpolation_scale_t, _h, _w)`` as the pipeline reads them from the config."""
    values = (config.interpolation_scale_t, config.interpolation_scale_h, config.interpolation_scale_w)
    if any(v is None for v in values):
        raise ValueError(f"Allegro config interpolation scales (t, h, w) = {values}: the pipeline needs all three")
    return values


def latent_grid(config, args, kwargs) -> tuple[int, int, int]:
    """``(F, H / p, W / p)`` of the forward's hidden states ``[B, C, F, H, W]``."""
    hidden_states = forward_arg(args, kwargs, "hidden_states", 0)
    check_latents(hidden_states, "[B, C, F, H, W]")
    frames, height, width = hidden_states.shape[2:]
    p = int(config.patch_size)
    return int(frames), int(height) // p, int(width) // p


def positions(config, grid, device):
    """Each axis' table positions: ``linspace(0, n - 1, n) / interpolation_scale`` (float32, as the builder)."""
    return [fitted_positions(0, n, n, device) / scale for n, scale in zip(grid, scales(config))], tuple(grid)


def extents(config, grid) -> list[float]:
    """``n / interpolation_scale`` per axis: the grid in the tables' coordinate units."""
    return [n / scale for n, scale in zip(grid, scales(config))]


def tables(seam, axis_positions, counts, spectra, stock):
    """The builder's per-axis ``(cos, sin)`` ``[n, D / 3]`` float32 (``get_1d_rotary_pos_embed(...,
    repeat_interleave_real=False)``) with ``spectra``; the integer positions are the caller's."""
    out = []
    for pos, spectrum, dim in zip(axis_positions, spectra, seam.axes_dims):
        freqs = axis_frequencies(spectrum, dim, seam.theta, torch.float32, pos.device)
        phases = torch.outer(pos, freqs)
        cos, sin = phases.cos(), phases.sin()
        if spectrum.magnitude != 1.0:
            cos, sin = cos * spectrum.magnitude, sin * spectrum.magnitude
        out.append((torch.cat([cos, cos], dim=-1).float(), torch.cat([sin, sin], dim=-1).float()))
    ids = stock[1] if stock is not None else None
    return tuple(out), ids


ALLEGRO = register_family(
    rotary_input_family(
        name="allegro",
        classes=("diffusers.models.transformers.transformer_allegro:AllegroTransformer3DModel",),
        axis_names=("t", "row", "col"),
        native_axes_dims=axes_dims,
        native_theta=lambda model: 10000.0,
        image_axes=(1, 2),
        time_axis=0,
        rotary_input=RotaryInput(
            grid=latent_grid,
            positions=positions,
            build=tables,
            builder="get_3d_rotary_pos_embed_allegro (AllegroPipeline._prepare_rotary_positional_embeddings)",
            extents=extents,
        ),
        timestep_per_sigma=1000.0,  # discrete scheduler timesteps 0 .. 999
        pipelines=("AllegroPipeline",),
        train_size=720,
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="the pipeline builds per-axis tables (forward(image_rotary_emb=...)) at positions / interpolation_scale "
        "(2.2, 2.0, 2.0): schedules work in those units, the training grid is given in tokens",
        extras={
            "image_coords_per_token": lambda model: (
                1.0 / model.config.interpolation_scale_h,
                1.0 / model.config.interpolation_scale_w,
            )
        },
    )
)
