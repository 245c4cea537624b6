"""LongCat-Image (``LongCatImageTransformer2DModel``): ``LongCatImagePosEmbed`` (FLUX.1's arithmetic) on ``ids [S, 3]``.

Axes ``(modality, row, col)``, theta 10000, ``axes_dims_rope`` ``(16, 56, 56)``; Flux-style ``(cos, sin)``
``[S, 128]`` float32 from fp64 phases, pairs repeated, axes in order. The model calls ``pos_embed`` once per forward
on ``cat(txt_ids, img_ids)``. Text ids are ``(0, j, j)``: text runs along the image axes, so the image ids start
after it (``(1, L + row, L + col)``, ``L`` = 512 or the prompt length); the edit pipeline appends the reference
image at modality 2 on the same rows and columns. A schedule's scale is read from the output image's tokens only
(modality 1, the smallest after the text); reference tokens get the output's spectrum, the text tokens (the first
``len(txt_ids)`` rows) the training spectrum. The pipelines pass ``timestep = sigma``; the model multiplies by 1000.
"""

from __future__ import annotations

import torch

from ....ops.tables import device_has_fp64
from . import register_family
from .base import Family, ids_values_key
from .codecs import cos_sin_text_then_image, ids_positions, ids_rows, masked_extents, note_text_tokens, scheduled


def longcat_tables(seam, ids: torch.Tensor):
    """``LongCatImagePosEmbed(ids)``: ``(cos, sin)`` ``[S, sum(axes_dims)]`` float32; text rows first."""
    pos = ids_positions(ids, len(seam.axes_dims))
    image = pos[min(int(getattr(seam, "text_tokens", 0)), pos.shape[0]) :]
    extents = None
    if image.shape[0] and scheduled(seam):
        modality = image[:, 0]
        extents = masked_extents(image, modality == modality.min())  # the output image, not the references
    freqs_dtype = torch.float64 if device_has_fp64(ids.device) else torch.float32
    return cos_sin_text_then_image(seam, pos, extents, freqs_dtype)


LONGCAT_IMAGE = register_family(
    Family(
        name="longcat_image",
        classes=("diffusers.models.transformers.transformer_longcat_image:LongCatImageTransformer2DModel",),
        position_attr="pos_embed",
        axis_names=("modality", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.pos_embed.axes_dim),
        native_theta=lambda model: float(model.pos_embed.theta),
        image_axes=(1, 2),
        tables=longcat_tables,
        tables_key=ids_values_key,
        timestep_per_sigma=1.0,  # the LongCat-Image pipelines pass t / 1000 = sigma
        timestep_arg=("timestep", 2),
        check_inputs=note_text_tokens(ids_rows("txt_ids", 4)),
        pipelines=("LongCatImagePipeline", "LongCatImageEditPipeline"),
        train_size=1024,
        pixels_per_token=16,
        notes="text ids run along the image axes (image ids start after them); scale from the output image "
        "(modality 1); the edit reference at modality 2 gets its spectrum; text on the training spectrum",
    )
)
