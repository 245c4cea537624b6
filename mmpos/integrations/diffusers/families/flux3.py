"""FLUX.3 (``Flux3Transformer2DModel``): four axes ``(t, h, w, l)``, theta 10000, ``Flux3PosEmbed``.

The model calls ``pos_embed`` once per token mode per forward: on ``txt_ids`` (``(0, 0, 0, j)``: text advances
along ``l``), on ``img_ids`` and, for image-to-image, on ``image_cond_ids``; each call returns Flux-style
``(cos, sin)`` ``[S, 128]`` float32 (fp64 phases, pairs repeated, axes in order; it loops over the model's four axes,
not the ids' columns). Image ids are fractional: ``(0, 0.5 row, 0.5 col, l)`` (the pipelines' ``image_rope_scale``),
so the rows and columns advance 0.5 a token and the schedules' training lengths are in those units
(``image_coords_per_token``). The output image has ``l = 0``, reference image ``i`` ``l = -(1 + i)`` on the same
rows and columns. Each call resolves the schedule at its own tokens' extent: the text's is one token (the training
spectrum), a reference keeps its own size. The pipelines pass ``timestep = sigma``; the model multiplies by 1000.
"""

from __future__ import annotations

import torch

from ....ops.tables import device_has_fp64
from . import register_family
from .base import Family, extents_of
from .codecs import cos_sin_repeated, scheduled

IMAGE_COORDS_PER_TOKEN = 0.5  # Flux3PrepareLatentsStep(image_rope_scale=0.5)
IMAGE_AXES = (1, 2)


def flux3_extents(pos: torch.Tensor) -> list[float]:
    """Per axis, the extent of ``pos [S, 4]`` in coordinate units: ``max - min`` plus one token's step (0.5 on
    the image rows and columns, 1 elsewhere)."""
    extents = extents_of(pos)
    for axis in IMAGE_AXES:
        extents[axis] += IMAGE_COORDS_PER_TOKEN - 1.0
    return extents


def flux3_tables(seam, ids: torch.Tensor):
    """``Flux3PosEmbed(ids)``: ``(cos, sin)`` ``[S, sum(axes_dims)]`` float32 for one token mode's ids."""
    if ids.dim() != 2 or ids.shape[-1] < len(seam.axes_dims):
        raise ValueError(f"ids have shape {tuple(ids.shape)}; expected [S, {len(seam.axes_dims)}] (t, h, w, l)")
    pos = ids.float()
    spectra = seam.axis_spectra(extents=flux3_extents(pos) if pos.shape[0] and scheduled(seam) else None)
    freqs_dtype = torch.float64 if device_has_fp64(ids.device) else torch.float32
    return cos_sin_repeated(pos, spectra, seam.axes_dims, seam.theta, freqs_dtype)


FLUX3 = register_family(
    Family(
        name="flux3",
        classes=("diffusers.models.transformers.transformer_flux3:Flux3Transformer2DModel",),
        position_attr="pos_embed",
        axis_names=("t", "row", "col", "l"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.pos_embed.axes_dim),
        native_theta=lambda model: float(model.pos_embed.theta),
        image_axes=IMAGE_AXES,
        tables=flux3_tables,
        timestep_per_sigma=1.0,  # the FLUX.3 pipelines pass t / 1000 = sigma
        timestep_arg=("timestep", 2),
        pipelines=("Flux3ModularPipeline", "Flux3DistilledModularPipeline"),
        train_size=1024,
        pixels_per_token=16,
        notes="image ids at 0.5 a token; references at l = -(1 + i), each call at its own extent",
        extras={"image_coords_per_token": IMAGE_COORDS_PER_TOKEN},
    )
)
