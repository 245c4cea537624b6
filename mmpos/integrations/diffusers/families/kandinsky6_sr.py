"""Kandinsky 6 SR (``Kandinsky6SRTransformer3DModel``, ``Kandinsky6SRPipeline``'s latent super-resolution): Kandinsky
6's visual rope (``Kandinsky6SRRoPE3D``: the same buffers, call and output, :mod:`.kandinsky6`).

The model builds ``visual_rope_pos`` (``arange`` of the patch grid per axis) itself and calls the rope once per
forward with its config's ``scale_factor`` (``(1, 2, 2)``); it has no text tokens. The pipeline passes the
scheduler's timesteps (``1000 sigma``) on tiles of the latent video; a schedule's extents are the tile's token grid.
"""

from __future__ import annotations

from dataclasses import replace

from . import register_family
from .kandinsky6 import KANDINSKY6

KANDINSKY6_SR = register_family(
    replace(
        KANDINSKY6,
        name="kandinsky6_sr",
        classes=("diffusers.models.transformers.transformer_kandinsky6_sr:Kandinsky6SRTransformer3DModel",),
        timestep_arg=("timestep", 1),
        pipelines=("Kandinsky6SRPipeline",),
        train_size=512,  # 512 x 512 tiles
        notes="Kandinsky 6's rope on super-resolution tiles; NABLA attention blocks of 8 x 8 tokens",
    )
)
