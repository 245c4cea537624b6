"""Motif-Video (``MotifVideoTransformer3DModel``; T2V and I2V): ``MotifVideoRotaryPosEmbed``, HunyuanVideo's rope
with float64 phases.

The model calls ``rope(hidden_states)`` once per forward on the latents ``[B, C, F, H, W]``; the module reads their
shape: the patch grid ``(t, row, col)`` of ``(F / patch_size_t, H / patch_size, W / patch_size)`` tokens from 0,
float32 ids, float64 phases (float32 on devices without float64), ``(cos, sin)`` ``[S, sum(rope_axes_dim)]`` float32,
pairs repeated, axes ``(16, 56, 56)``, theta 256 (:func:`.hunyuan_video15.grid_tables`). Only video tokens are
rotated; the schedule's extents are the patch grid.
"""

from __future__ import annotations

import torch

from ....ops.tables import device_has_fp64
from . import register_family
from .base import Family
from .hunyuan_video15 import grid_tables, latent_patch_grid


def motif_video_tables(seam, hidden_states: torch.Tensor):
    """The stock output ``(cos, sin)`` ``[F * H * W, sum(axes_dims)]`` float32 of latents ``[B, C, F, H, W]``."""
    freqs_dtype = torch.float64 if device_has_fp64(hidden_states.device) else torch.float32
    return grid_tables(seam, latent_patch_grid(seam, hidden_states), hidden_states.device, freqs_dtype)


MOTIF_VIDEO = register_family(
    Family(
        name="motif_video",
        classes=("diffusers.models.transformers.transformer_motif_video:MotifVideoTransformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.rope_axes_dim),
        native_theta=lambda model: float(model.config.rope_theta),
        image_axes=(1, 2),
        time_axis=0,
        tables=motif_video_tables,
        timestep_per_sigma=1000.0,  # the pipelines pass the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", 1),
        pipelines=("MotifVideoPipeline", "MotifVideoImage2VideoPipeline"),
        train_size=960,  # 720p (1280 x 720 ~ 960 x 960)
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="video tokens only; grid from the latent shape; float64 phases",
    )
)
