"""GLM-Image (``GlmImageTransformer2DModel``, ``GlmImagePipeline``): ``GlmImageRotaryPosEmbed`` on the latents,
CogView4's half layout without its position normalisation.

The model calls ``rope(hidden_states)`` once per forward on the latents ``[B, C, H, W]`` (the denoised image, and
each condition image when the pipeline fills the KV cache), unless the caller passes ``image_rotary_emb``. Axes
``(row, col)`` with ``attention_head_dim / 2`` channels each, theta 10000; row ``i`` sits at ``i`` (integer
positions, float32 phases on the CPU), tables ``(cos, sin)`` ``[H * W, head_dim]`` float32 on the CPU in the half
layout ``[h | w | h | w]`` (:func:`.cogview4.half_layout_tables`). Only the image tokens are rotated; the schedule's
extents are the patch grid. The pipeline passes ``timestep = t - 1`` (``1000 sigma - 1``).
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family, check_latents
from .cogview4 import half_layout_tables


def glm_image_tables(seam, hidden_states: torch.Tensor):
    """The stock output ``(cos, sin)`` ``[H * W, head_dim]`` float32 on the CPU for latents ``[B, C, H, W]``."""
    check_latents(hidden_states, "[B, C, H, W]")
    patch = seam.stock[0].patch_size
    height, width = hidden_states.shape[2] // patch, hidden_states.shape[3] // patch
    spectra = seam.axis_spectra(extents=[float(height), float(width)])
    positions = [torch.arange(height).float(), torch.arange(width).float()]
    return half_layout_tables(seam, positions, spectra)


GLM_IMAGE = register_family(
    Family(
        name="glm_image",
        classes=("diffusers.models.transformers.transformer_glm_image:GlmImageTransformer2DModel",),
        position_attr="rope",
        axis_names=("row", "col"),
        native_axes_dims=lambda model: (int(model.config.attention_head_dim) // 2,) * 2,
        native_theta=lambda model: float(model.rope.theta),
        image_axes=(0, 1),
        tables=glm_image_tables,
        timestep_per_sigma=1000.0,  # GlmImagePipeline passes t - 1 (the scheduler's timesteps minus one)
        timestep_at_zero_sigma=-1.0,
        timestep_arg=("timestep", 4),
        pipelines=("GlmImagePipeline",),
        train_size=1024,
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="CogView4's half layout, integer positions; image tokens only; t - 1 timesteps",
    )
)
