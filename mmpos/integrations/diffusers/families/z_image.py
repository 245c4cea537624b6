"""Z-Image (Turbo, Base, Omni; ``ZImageTransformer2DModel``): three axes ``(index, row, col)``, theta 256.

Its ``rope_embedder`` is a plain object (``RopeEmbedder``, not a module), called once per token kind and forward:
on the image ids, on the caption ids and (Omni) on the SigLIP ids, each ``[S, 3]`` int32. It precomputes on the CPU
complex64 tables ``polar(1, float32(p * ladder))`` (float64 ladder and phases) for ``p < axes_lens`` and indexes
them by the ids: the "wall at 2048 px" (row / col ids past ``axes_lens``, 512 tokens by default, fail). The seam
computes the same rows from the positions instead (:class:`~.codecs.PrecomputedRows`), so larger grids just work.
Captions are ``(1 + j, 0, 0)`` and images ``(caption length + 1, row, col)``; padding tokens are ``(0, 0, 0)``. A
schedule reads its scale from each call's rows and columns: captions (extent 1) keep the training spectrum.
The pipelines pass ``t = 1 - sigma`` (time running backwards).
"""
from __future__ import annotations

import torch

from . import register_family
from .base import Family, extents_of
from .codecs import complex_pairs, precomputed_rows

_STOCK = dict(freqs_dtype=torch.float64, phase_dtype=torch.float32)  # RopeEmbedder.precompute_freqs_cis


def z_image_tables(seam, ids: torch.Tensor) -> torch.Tensor:
    """``RopeEmbedder(ids)``: ``ids [S, 3]`` integer -> complex64 ``[S, sum(axes_dims) / 2]`` on ``ids``' device."""
    if ids.dim() != 2 or ids.shape[-1] != len(seam.axes_dims):
        raise ValueError(f"ids have shape {tuple(ids.shape)}; expected [S, {len(seam.axes_dims)}] (index, row, col)")
    spectra = _spectra(seam, ids)
    return complex_pairs(ids, spectra, seam.axes_dims, seam.theta, rows=precomputed_rows(seam, **_STOCK), **_STOCK)


def _spectra(seam, ids: torch.Tensor):
    """Captions (rows and cols all 0) keep the training spectrum; images and SigLIP tokens get the schedule at
    their extent. Without a schedule, no extent is read (no device sync; ``torch.compile`` traces through)."""
    if seam.encodings[0].schedule is None:
        return seam.axis_spectra()
    extents = extents_of(ids) if ids.shape[0] else [0.0] * ids.shape[-1]
    rows, cols = (extents[axis] for axis in Z_IMAGE.image_axes)
    return seam.training_spectra() if max(rows, cols) <= 1 else seam.axis_spectra(extents=extents)


Z_IMAGE = register_family(Family(
    name="z_image",
    classes=("diffusers.models.transformers.transformer_z_image:ZImageTransformer2DModel",),
    position_attr="rope_embedder",
    axis_names=("index", "row", "col"),
    native_axes_dims=lambda model: tuple(int(d) for d in model.config.axes_dims),
    native_theta=lambda model: float(model.config.rope_theta),
    image_axes=(1, 2),
    tables=z_image_tables,
    timestep_per_sigma=-1.0,  # ZImagePipeline passes t = (1000 - timestep) / 1000 = 1 - sigma
    timestep_at_zero_sigma=1.0,
    timestep_arg=("t", 1),
    pipelines=("ZImagePipeline", "ZImageImg2ImgPipeline", "ZImageInpaintPipeline", "ZImageControlNetPipeline",
               "ZImageControlNetInpaintPipeline", "ZImageOmniPipeline"),
    train_size=1024,
    pixels_per_token=16,
    notes="positions past axes_lens (the 2048 px wall) computed, not indexed; t = 1 - sigma",
))
