"""Kandinsky 5 (``Kandinsky5Transformer3DModel``; T2V, I2V, T2I, I2I): ``Kandinsky5RoPE3D``, Kandinsky 6's visual rope
with a batch dimension.

The model calls ``visual_rope_embeddings(shape, visual_rope_pos, scale_factor)`` once per forward: ``shape`` is the
visual tokens' ``(B, T, H, W)``, ``visual_rope_pos`` one index tensor per axis (the pipelines' ``arange`` of the
latent patch grid) and ``scale_factor`` the pipelines' resolution-dependent divisor per axis (Kandinsky 5's own
interpolation, kept). The stock module looks the angles up in float32 buffers ``args_i = outer(arange(128), freq)``
(following the model's casts), divides them by ``scale_factor`` and returns rotation matrices
``[B, T, H, W, 1, D / 2, 2, 2]``; here they are :func:`.kandinsky6.kandinsky6_tables` (computed from the positions,
so grids past 128 tokens per axis just work) repeated over the batch. The text rope (1D) stays stock. The pipelines
pass the scheduler's timesteps (``1000 sigma``).
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family, SpectrumSeam
from .kandinsky6 import kandinsky6_tables


def _stock_rope(model):
    """The stock position module (also while ``set_pe`` has replaced it)."""
    rope = model.visual_rope_embeddings
    return rope.stock[0] if isinstance(rope, SpectrumSeam) else rope


def kandinsky5_tables(seam, shape, pos, scale_factor=(1.0, 1.0, 1.0)) -> torch.Tensor:
    """``shape`` ``(B, T, H, W)``, ``pos`` ``(t [T], row [H], col [W])`` -> ``[B, T, H, W, 1, D / 2, 2, 2]``."""
    table = kandinsky6_tables(seam, pos, scale_factor)
    if tuple(table.shape[:3]) != tuple(shape[1:4]):
        raise ValueError(f"visual_rope_pos spans {tuple(table.shape[:3])} tokens; shape is {tuple(shape)}")
    return table.unsqueeze(0).repeat(shape[0], *([1] * table.dim()))


KANDINSKY5 = register_family(
    Family(
        name="kandinsky5",
        classes=("diffusers.models.transformers.transformer_kandinsky:Kandinsky5Transformer3DModel",),
        position_attr="visual_rope_embeddings",
        axis_names=("t", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in _stock_rope(model).axes_dims),
        native_theta=lambda model: float(_stock_rope(model).max_period),
        image_axes=(1, 2),
        time_axis=0,
        tables=kandinsky5_tables,
        cast_probe="args_0",  # the tables follow the stock buffers' casts
        timestep_per_sigma=1000.0,  # the pipelines pass the scheduler's timesteps, on the [0, 1000] scale
        timestep_arg=("timestep", 2),
        pipelines=("Kandinsky5T2VPipeline", "Kandinsky5I2VPipeline", "Kandinsky5T2IPipeline", "Kandinsky5I2IPipeline"),
        train_size=512,
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="Kandinsky 6's rotation matrices per sample; the pipelines' resolution scale_factor kept; positions "
        "beyond the 128-entry buffers computed",
    )
)
