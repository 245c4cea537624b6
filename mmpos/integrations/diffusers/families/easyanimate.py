"""EasyAnimate (``EasyAnimateTransformer3DModel``, ``EasyAnimatePipeline`` and its control / inpaint variants): its
``rope_embedding`` (``EasyAnimateRotaryPosEmbed``) calls ``get_3d_rotary_pos_embed`` on the latent token grid of the
hidden states ``[B, C, F, H, W]``, as CogVideoX 1.0's pipelines do (:mod:`.cogvideox`), on the CPU (no device
given).

Rows and columns are **fitted into a fixed base grid** of ``60 / p x 90 / p`` tokens (``p`` the patch size; the
resize-crop region, then ``linspace(start, stop (n - 1) / n, n)``): a larger image gets fractional positions inside
the base grid (built-in position interpolation), so a spatial extrapolation preset, given the training grid in base
units, sees about the base extent and changes little; time grows with the clip (``0 .. F - 1``), which is where
RIFLEx and the other time policies act. Axes ``(t, row, col)`` of ``D / 4, 3 D / 8, 3 D / 8`` channels, theta 10000,
float32. The pipelines pass the scheduler's timesteps (1000 sigma).
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family, check_latents
from .cogvideox import axes_dims
from .cogvideox import tables as get_3d_rotary_tables
from .rotary_input import fitted_positions, resize_crop_region


def easyanimate_tables(seam, hidden_states: torch.Tensor):
    """``EasyAnimateRotaryPosEmbed.forward``: ``(cos, sin)`` ``[F H W, D]`` float32 on the CPU."""
    check_latents(hidden_states, "[B, C, F, H, W]")
    p = int(seam.stock[0].patch_size)
    frames, rows, cols = int(hidden_states.shape[2]), int(hidden_states.shape[3]) // p, int(hidden_states.shape[4]) // p
    start, stop = resize_crop_region((rows, cols), 90 // p, 60 // p)
    cpu = torch.device("cpu")
    positions = [
        fitted_positions(0, frames, frames, cpu),
        fitted_positions(start[0], stop[0], rows, cpu),
        fitted_positions(start[1], stop[1], cols, cpu),
    ]
    spectra = seam.axis_spectra(extents=lambda: [float(p.max() - p.min()) + 1.0 for p in positions])
    return get_3d_rotary_tables(seam, positions, (frames, rows, cols), spectra)


EASYANIMATE = register_family(
    Family(
        name="easyanimate",
        classes=("diffusers.models.transformers.transformer_easyanimate:EasyAnimateTransformer3DModel",),
        position_attr="rope_embedding",
        axis_names=("t", "row", "col"),
        native_axes_dims=axes_dims,
        native_theta=lambda model: 10000.0,
        image_axes=(1, 2),
        time_axis=0,
        tables=easyanimate_tables,
        timestep_per_sigma=1000.0,
        timestep_arg=("timestep", 1),
        pipelines=("EasyAnimatePipeline", "EasyAnimateControlPipeline", "EasyAnimateInpaintPipeline"),
        train_size=512,
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="CogVideoX 1.0's builder in the model: rows and columns fitted into a fixed 60/p x 90/p base grid "
        "(built-in interpolation; presets in base units), extrapolation acts on time",
    )
)
