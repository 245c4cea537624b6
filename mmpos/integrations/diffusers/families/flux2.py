"""FLUX.2 (dev, Klein; ``Flux2Transformer2DModel``): four axes ``(t, h, w, l)``, theta 2000, ``Flux2PosEmbed``.

The model calls ``pos_embed`` twice per forward, on ``img_ids [S_img, 4]`` and on ``txt_ids [S_txt, 4]``; each
call returns ``(cos, sin)`` ``[S, 128]`` float32 (fp64 phases, pairs repeated). Reference images of the edit
models are concatenated to the image tokens with ``t = 10, 20, ...``; the output image has ``t = 0``. A schedule
reads its scale from the output image's rows and columns (its extent); reference tokens get the same spectrum.
Text ids are ``(0, 0, 0, l)``: extent 1 on the image axes, so text stays on the training spectrum.
"""
from __future__ import annotations

import torch

from ....ops.tables import device_has_fp64
from . import register_family
from .base import Family, extents_of
from .codecs import cos_sin_repeated


def flux2_tables(seam, ids: torch.Tensor):
    if ids.dim() != 2 or ids.shape[-1] < len(seam.axes_dims):
        raise ValueError(f"ids have shape {tuple(ids.shape)}; expected [S, {len(seam.axes_dims)}] (t, h, w, l)")
    pos = ids.float()
    output = pos[pos[:, 0] == pos[:, 0].min()] if pos.shape[0] else pos  # the output image (t = 0), not references
    spectra = seam.axis_spectra(extents=extents_of(output) if pos.shape[0] else None)
    freqs_dtype = torch.float64 if device_has_fp64(ids.device) else torch.float32
    return cos_sin_repeated(pos, spectra, seam.axes_dims, seam.theta, freqs_dtype)


FLUX2 = register_family(Family(
    name="flux2",
    classes=("diffusers.models.transformers.transformer_flux2:Flux2Transformer2DModel",),
    position_attr="pos_embed",
    axis_names=("t", "row", "col", "l"),
    native_axes_dims=lambda model: tuple(int(d) for d in model.config.axes_dims_rope),
    native_theta=lambda model: float(model.config.rope_theta),
    image_axes=(1, 2),
    tables=flux2_tables,
    timestep_per_sigma=1.0,  # the pipelines pass t / 1000; the model multiplies by 1000
    timestep_arg=("timestep", 2),
    pipelines=("Flux2Pipeline", "Flux2KleinPipeline"),
    train_size=1024,
    pixels_per_token=16,
    notes="reference images at t = 10, 20, ...; scale from the output image",
))
