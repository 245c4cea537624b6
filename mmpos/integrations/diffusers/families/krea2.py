"""Krea 2 (``Krea2Transformer2DModel``): ``rotary_emb`` (FLUX.1's arithmetic) on ``position_ids [S, 3]``, theta 1000.

Axes ``(t, row, col)``, ``axes_dims_rope`` ``(32, 48, 48)``; Flux-style ``(cos, sin)`` ``[S, 128]`` float32 from fp64
phases, pairs repeated, axes in order, shared by the query heads and the fewer key / value heads (grouped-query
attention repeats the rotated keys, so the tables are per head dim only). The single-stream sequence is
``[text, image]``: ``Krea2Pipeline.prepare_position_ids`` puts the text at the origin and the image tokens at their
``(0, row, col)`` latent-grid coordinates (2 x 2 patches on an 8x VAE: 16 px a token). A schedule's scale is read
from the image rows only; the text rows (as many as ``encoder_hidden_states`` has tokens) keep the training
spectrum. The pipeline passes ``timestep = t / 1000 = sigma``; the model's embedding multiplies by 1000.
"""

from __future__ import annotations

import torch

from ....ops.tables import device_has_fp64
from . import register_family
from .base import Family, extents_of
from .codecs import cos_sin_text_then_image, forward_arg, ids_positions, note_text_tokens, scheduled


def krea2_tables(seam, position_ids: torch.Tensor):
    """``Krea2RotaryPosEmbed(position_ids)``: ``(cos, sin)`` ``[S, sum(axes_dims)]`` float32; text rows first."""
    pos = ids_positions(position_ids, len(seam.axes_dims))
    image = pos[min(int(getattr(seam, "text_tokens", 0)), pos.shape[0]) :]
    freqs_dtype = torch.float64 if device_has_fp64(position_ids.device) else torch.float32
    return cos_sin_text_then_image(
        seam, pos, extents_of(image) if image.shape[0] and scheduled(seam) else None, freqs_dtype
    )


def _text_tokens(args, kwargs) -> int:
    """The text tokens of the forward: ``encoder_hidden_states [B, L, layers, D]``'s ``L``."""
    text = forward_arg(args, kwargs, "encoder_hidden_states", 1)
    return text.shape[1] if isinstance(text, torch.Tensor) and text.dim() >= 2 else 0


KREA2 = register_family(
    Family(
        name="krea2",
        classes=("diffusers.models.transformers.transformer_krea2:Krea2Transformer2DModel",),
        position_attr="rotary_emb",
        axis_names=("t", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.rotary_emb.axes_dim),
        native_theta=lambda model: float(model.rotary_emb.theta),
        image_axes=(1, 2),
        tables=krea2_tables,
        timestep_per_sigma=1.0,  # Krea2Pipeline passes t / num_train_timesteps = sigma
        timestep_arg=("timestep", 2),
        check_inputs=note_text_tokens(_text_tokens),
        pipelines=("Krea2Pipeline",),
        train_size=1024,
        pixels_per_token=16,
        notes="single stream [text, image]; text at the origin on the training spectrum; grouped-query attention",
    )
)
