"""Bria 3.2 (``BriaTransformer2DModel``) and Bria FIBO (``BriaFiboTransformer2DModel``; T2I and Edit): FLUX.1's
arithmetic (``BriaEmbedND`` / ``BriaFiboEmbedND``) on ``ids [S, 3]``, axes ``(index, row, col)``.

Both models call ``pos_embed`` once per forward on ``cat(txt_ids, img_ids)``: the pipelines give text ids of zeros
and image ids ``(0, row, col)`` of the latent grid (2 x 2 patches on an 8x VAE for Bria 3.2, 16 px a token; FIBO's
16x Wan 2.2 VAE with patch 1, 16 px a token). Output and arithmetic are Chroma's (:func:`.chroma.chroma_tables`):
``(cos, sin)`` ``[S, sum(axes_dims)]`` float32 from fp64 phases, pairs repeated. The text rows (as many as
``txt_ids`` has) keep the training spectrum; a schedule's scale is read from the image rows. The pipelines pass
the scheduler's timesteps (``1000 sigma``).
"""

from __future__ import annotations

from dataclasses import replace

from . import register_family
from .base import Family, ids_values_key
from .chroma import chroma_tables
from .codecs import ids_rows, note_text_tokens

BRIA = register_family(
    Family(
        name="bria",
        classes=("diffusers.models.transformers.transformer_bria:BriaTransformer2DModel",),
        position_attr="pos_embed",
        axis_names=("index", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.pos_embed.axes_dim),
        native_theta=lambda model: float(model.pos_embed.theta),
        image_axes=(1, 2),
        tables=chroma_tables,
        tables_key=ids_values_key,
        timestep_per_sigma=1000.0,  # BriaPipeline passes the scheduler's timesteps
        timestep_arg=("timestep", 3),
        check_inputs=note_text_tokens(ids_rows("txt_ids", 5)),
        pipelines=("BriaPipeline",),
        train_size=1024,
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="FLUX.1's tables; text (zeros) on the training spectrum",
    )
)

BRIA_FIBO = register_family(
    replace(
        BRIA,
        name="bria_fibo",
        classes=("diffusers.models.transformers.transformer_bria_fibo:BriaFiboTransformer2DModel",),
        timestep_arg=("timestep", 4),
        check_inputs=note_text_tokens(ids_rows("txt_ids", 6)),
        pipelines=("BriaFiboPipeline", "BriaFiboEditPipeline"),
        pixels_per_token=16,  # 16x VAE, patch 1
    )
)
