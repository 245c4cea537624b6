"""Ovis-Image (``OvisImageTransformer2DModel``): ``OvisImagePosEmbed`` (FLUX.1's arithmetic) on ``ids [S, 3]``.

Axes ``(index, row, col)``, theta 10000, ``axes_dims_rope`` ``(16, 56, 56)``. The model calls ``pos_embed`` once per
forward on ``cat(txt_ids, img_ids)``; ``OvisImagePipeline`` gives text ids of zeros and image ids ``(0, row, col)``
(2 x 2 patches on an 8x VAE: 16 px a token). Tables as Chroma's (:func:`.chroma.chroma_tables`): text rows on the
training spectrum, a schedule's scale from the image rows. The pipeline passes ``timestep = t / 1000 = sigma``.
"""

from __future__ import annotations

from . import register_family
from .base import Family, ids_values_key
from .chroma import chroma_tables
from .codecs import ids_rows, note_text_tokens

OVIS_IMAGE = register_family(
    Family(
        name="ovis_image",
        classes=("diffusers.models.transformers.transformer_ovis_image:OvisImageTransformer2DModel",),
        position_attr="pos_embed",
        axis_names=("index", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.pos_embed.axes_dim),
        native_theta=lambda model: float(model.pos_embed.theta),
        image_axes=(1, 2),
        tables=chroma_tables,
        tables_key=ids_values_key,
        timestep_per_sigma=1.0,  # OvisImagePipeline passes t / 1000 = sigma (the model multiplies by 1000)
        timestep_arg=("timestep", 2),
        check_inputs=note_text_tokens(ids_rows("txt_ids", 4)),
        pipelines=("OvisImagePipeline",),
        train_size=1024,
        pixels_per_token=16,
        notes="FLUX.1's tables; text (zeros) on the training spectrum",
    )
)
