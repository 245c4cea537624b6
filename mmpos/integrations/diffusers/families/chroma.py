"""Chroma (``ChromaTransformer2DModel``): FLUX.1's own ``FluxPosEmbed`` on ``ids [S, 3]`` axes ``(index, row, col)``.

Tier 2: ``"native"`` rebuilds the stock tables below (stock processors); any other rotary encoding runs through
FLUX.1's seam and processors (Chroma's attention layers are ``FluxAttention`` with ``FluxAttnProcessor``).

The model calls ``pos_embed`` once per forward on ``cat(txt_ids, img_ids)``: text ids are zeros, image ids
``(0, row, col)`` of the latent grid (2 x 2 patches: 16 px a token). Theta 10000, ``axes_dims_rope`` ``(16, 56, 56)``;
the output is Flux-style ``(cos, sin)`` ``[S, 128]`` float32 from fp64 phases, each pair's value repeated, axes
concatenated in order. A schedule's scale is read from the image tokens' rows and columns; the text tokens (all at
the origin, told apart by their count: the forward's ``txt_ids``) keep the training spectrum, so a YaRN magnitude
reaches the image tokens only. Chroma's pipelines pass ``timestep = sigma``; the model multiplies by 1000.
"""

from __future__ import annotations

import torch

from ....ops.tables import device_has_fp64
from . import register_family
from .base import Family, extents_of, ids_values_key
from .codecs import cos_sin_text_then_image, ids_positions, ids_rows, note_text_tokens, scheduled
from .flux import flux_attention_modules, flux_bundle_tables, flux_processors, flux_seam, flux_stock_processor


def chroma_tables(seam, ids: torch.Tensor):
    """``FluxPosEmbed(ids)``: ``(cos, sin)`` ``[S, sum(axes_dims)]`` float32; text rows first (``seam.text_tokens``)."""
    pos = ids_positions(ids, len(seam.axes_dims))
    image = pos[min(int(getattr(seam, "text_tokens", 0)), pos.shape[0]) :]
    freqs_dtype = torch.float64 if device_has_fp64(ids.device) else torch.float32
    return cos_sin_text_then_image(
        seam, pos, extents_of(image) if image.shape[0] and scheduled(seam) else None, freqs_dtype
    )


CHROMA = register_family(
    Family(
        name="chroma",
        classes=("diffusers.models.transformers.transformer_chroma:ChromaTransformer2DModel",),
        position_attr="pos_embed",
        axis_names=("index", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.pos_embed.axes_dim),
        native_theta=lambda model: float(model.pos_embed.theta),
        image_axes=(1, 2),
        tables=chroma_tables,  # native: the stock processors stay
        tables_key=ids_values_key,
        tier=2,  # any other rotary encoding: FLUX.1's mmpos processors (Chroma's attention is FluxAttention)
        attention_modules=flux_attention_modules,
        stock_processor=flux_stock_processor,
        make_processors=flux_processors,
        make_seam=flux_seam,
        timestep_per_sigma=1.0,  # ChromaPipeline passes t / 1000 = sigma
        timestep_arg=("timestep", 2),
        check_inputs=note_text_tokens(ids_rows("txt_ids", 4)),
        bundle_tables=flux_bundle_tables,
        pipelines=("ChromaPipeline", "ChromaImg2ImgPipeline", "ChromaInpaintPipeline"),
        train_size=1024,
        pixels_per_token=16,
        notes="any rotary encoding (FLUX.1's processors; native: stock processors); text (zeros) on the training "
        "spectrum",
    )
)
