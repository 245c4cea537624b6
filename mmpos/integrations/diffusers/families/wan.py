"""Wan 2.1 / 2.2 (``WanTransformer3DModel``; T2V, I2V, TI2V, VACE-free): ``WanRotaryPosEmbed`` on the latents.

Tier 2: the seam (:class:`~..positions.WanPositions`: the patch grid ``(t, row, col)`` of the latents) and mmpos
processors (:class:`~..processors.WanPEAttnProcessor`, self-attention only), so any rotary encoding and the
camera adapters install. Wan 2.2 TI2V passes per-token timesteps (``expand_timesteps``) with the pinned first
frame at 0: the step's sigma is read from the noisy tokens (:meth:`~.base.Family.sigma`).
"""

from __future__ import annotations

import torch

from ..context_parallel import refuse_after_parallelism
from ..positions import WanPositions
from . import register_family
from .base import Family


def _processor():
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    return WanAttnProcessor


def _self_attention(model):
    return [(f"blocks.{i}.attn1", block.attn1) for i, block in enumerate(model.blocks)]


def _axes_dims(model):
    rope = model.rope
    return (int(rope.t_dim), int(rope.h_dim), int(rope.w_dim))


def _seam(model, stock, encodings, native, coord_axes):
    probe = getattr(stock, "freqs_cos", None)
    native_dtype = probe.dtype if probe is not None else torch.float32
    return WanPositions(encodings, native, coord_axes, model.config.patch_size, native_dtype)


def _processors(beneath, rotation, native):
    from ..processors import WanPEAttnProcessor, processors_beneath, wan_stock_rotation

    return processors_beneath(beneath, wan_stock_rotation if native else rotation, lambda _: WanPEAttnProcessor)


def _global_coords(seam, args, kwargs):
    return seam.global_coords(args, kwargs)


check_no_sharded_seam = refuse_after_parallelism("rope")  # Wan's plan hooks the position module itself


WAN = register_family(
    Family(
        name="wan",
        classes=("diffusers.models.transformers.transformer_wan:WanTransformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=_axes_dims,
        native_theta=lambda model: 10000.0,  # WanRotaryPosEmbed's default; the model never passes another
        image_axes=(1, 2),
        time_axis=0,
        timestep_per_sigma=1000.0,  # WanPipeline passes the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", 1),
        tier=2,
        attention_modules=_self_attention,
        stock_processor=_processor,
        make_processors=_processors,
        make_seam=_seam,
        check_model=check_no_sharded_seam,
        global_coords=_global_coords,
        context_parallel=True,  # tests/integrations/test_context_parallel.py
        pipelines=("WanPipeline", "WanImageToVideoPipeline"),
        train_size=832,
        pixels_per_token=16,
        notes="any rotary encoding, camera adapters; TI2V per-token timesteps: sigma from the noisy tokens",
    )
)
