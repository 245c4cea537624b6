"""HunyuanVideo 1.0 (``HunyuanVideoTransformer3DModel``; T2V, I2V, SkyReels-V1 I2V): ``HunyuanVideoRotaryPosEmbed``.

The same rope as HunyuanVideo 1.5 (:mod:`.hunyuan_video15`): called once per forward on the latents
``[B, C, F, H, W]``, it returns ``(cos, sin)`` ``[S, 128]`` float32 of the patch grid ``(t, row, col)``
(``F / patch_size_t, H / 2, W / 2`` tokens from 0), float32 phases, pairs repeated, axes ``(16, 56, 56)``,
theta 256. Text tokens get no rotary position; the schedule's extents are the patch grid. The I2V
``token_replace`` variant reads no other attribute of the rope. Framepack
(``HunyuanVideoFramepackTransformer3DModel``, a separate class with clean-latent ropes) is not covered.
"""

from __future__ import annotations

from dataclasses import replace

from . import register_family
from .hunyuan_video15 import HUNYUAN_VIDEO15

# HunyuanVideo 1.5's family with 1.0's classes, pipelines and training size
HUNYUAN_VIDEO = register_family(
    replace(
        HUNYUAN_VIDEO15,
        name="hunyuan_video",
        classes=("diffusers.models.transformers.transformer_hunyuan_video:HunyuanVideoTransformer3DModel",),
        pipelines=("HunyuanVideoPipeline", "HunyuanVideoImageToVideoPipeline", "HunyuanSkyreelsImageToVideoPipeline"),
        train_size=960,  # 720p (1280 x 720 ~ 960 x 960)
        pixels_per_token=16,  # 8x VAE, patch 2
        attention_modules=None,  # no camera site: its single-stream blocks attend over text and video tokens at once
        camera=None,
    )
)
