"""HunyuanImage 2.1 (``HunyuanImageTransformer2DModel``): ``HunyuanImageRotaryPosEmbed`` on the latents.

The model calls ``rope(hidden_states)`` once per forward on the latents ``[B, C, H, W]``; the module reads their
shape: the patch grid ``(row, col)`` of ``(H / p_h, W / p_w)`` tokens from 0, float32 ids, and returns ``(cos, sin)``
``[H * W, sum(rope_axes_dim)]`` float32 (``get_1d_rotary_pos_embed``: float32 phases, pairs repeated), axes
``rope_axes_dim = (64, 64)``, theta 256. Only the image tokens are rotated, so the schedule's extents are the patch
grid. The distilled (meanflow) model is the same class. A config with a 3D rope (latents ``[B, C, F, H, W]``,
``HunyuanImageRefinerPipeline``'s refiner) is refused by name: its axes would differ from this family's.
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family, check_latents
from .hunyuan_video15 import grid_tables


def _check_model(model) -> None:
    if len(model.config.rope_axes_dim) != 2:
        raise TypeError(
            f"set_pe reaches HunyuanImage with a 2D rope (rope_axes_dim of 2 axes, row and col); this model has "
            f"rope_axes_dim={tuple(model.config.rope_axes_dim)} (the 3D refiner config is not covered)"
        )


def hunyuan_image_tables(seam, hidden_states: torch.Tensor):
    """The stock output ``(cos, sin)`` ``[H * W, sum(axes_dims)]`` float32 of latents ``[B, C, H, W]``."""
    check_latents(hidden_states, "[B, C, H, W]")
    p_h, p_w = seam.stock[0].patch_size
    sizes = (hidden_states.shape[2] // p_h, hidden_states.shape[3] // p_w)
    return grid_tables(seam, sizes, hidden_states.device)


HUNYUAN_IMAGE = register_family(
    Family(
        name="hunyuan_image",
        classes=("diffusers.models.transformers.transformer_hunyuanimage:HunyuanImageTransformer2DModel",),
        position_attr="rope",
        axis_names=("row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.rope_axes_dim),
        native_theta=lambda model: float(model.config.rope_theta),
        image_axes=(0, 1),
        tables=hunyuan_image_tables,
        check_model=_check_model,
        timestep_per_sigma=1000.0,  # HunyuanImagePipeline passes the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", 1),
        pipelines=("HunyuanImagePipeline",),
        train_size=2048,
        pixels_per_token=32,  # 32x VAE, patch 1
        notes="image tokens only (text unrotated); grid from the latent shape; the 3D-rope refiner config refused",
    )
)
