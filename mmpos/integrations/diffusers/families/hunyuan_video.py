"""HunyuanVideo 1.0 (``HunyuanVideoTransformer3DModel``; T2V, I2V, SkyReels-V1 I2V): ``HunyuanVideoRotaryPosEmbed``.

The same rope as HunyuanVideo 1.5 (:mod:`.hunyuan_video15`): called once per forward on the latents
``[B, C, F, H, W]``, it returns ``(cos, sin)`` ``[S, 128]`` float32 of the patch grid ``(t, row, col)``
(``F / patch_size_t, H / 2, W / 2`` tokens from 0), float32 phases, pairs repeated, axes ``(16, 56, 56)``,
theta 256. Text tokens get no rotary position; the schedule's extents are the patch grid. The I2V
``token_replace`` variant reads no other attribute of the rope. Framepack
(``HunyuanVideoFramepackTransformer3DModel``, a separate class with clean-latent ropes) is not covered.
"""
from __future__ import annotations

from . import register_family
from .base import Family
from .hunyuan_video15 import latent_grid_tables

HUNYUAN_VIDEO = register_family(Family(
    name="hunyuan_video",
    classes=("diffusers.models.transformers.transformer_hunyuan_video:HunyuanVideoTransformer3DModel",),
    position_attr="rope",
    axis_names=("t", "row", "col"),
    native_axes_dims=lambda model: tuple(int(d) for d in model.config.rope_axes_dim),
    native_theta=lambda model: float(model.config.rope_theta),
    image_axes=(1, 2),
    time_axis=0,
    tables=latent_grid_tables,
    timestep_per_sigma=1000.0,  # the pipelines pass the scheduler's timesteps (sigma * 1000)
    timestep_arg=("timestep", 1),
    pipelines=("HunyuanVideoPipeline", "HunyuanVideoImageToVideoPipeline", "HunyuanSkyreelsImageToVideoPipeline"),
    train_size=960,  # 720p (1280 x 720 ~ 960 x 960)
    pixels_per_token=16,  # 8x VAE, patch 2
    notes="video tokens only (text unrotated); grid from the latent shape",
))
