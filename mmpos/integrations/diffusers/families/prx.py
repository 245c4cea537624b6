"""PRX (``PRXTransformer2DModel``; latent and pixel-space): ``PRXEmbedND`` on image ids ``[B, N, 2]``, rotation
matrices.

The model builds ``img_ids`` (``(row, col)`` of the patch grid, float32) and calls ``pe_embedder(img_ids)`` once per
forward; only the image tokens are rotated. Axes ``(row, col)``, ``axes_dim`` (32, 32), theta 10000: per axis
``ids * inv_freq`` with the float64 ladder ``1 / theta ** (2i / d)`` (float32 where the device has no float64), then
``[[cos, -sin], [sin, cos]]`` per pair, rounded to float32: ``[B, 1, N, D / 2, 2, 2]``. A schedule's extents are the
ids' rows and columns. The pipelines pass ``timestep = t / 1000 = sigma`` (the model multiplies by ``time_factor``).
"""

from __future__ import annotations

import torch

from ....ops.tables import device_has_fp64
from . import register_family
from .base import Family, extents_of, ids_values_key
from .codecs import axis_frequencies, rotation_matrices


def prx_tables(seam, ids: torch.Tensor) -> torch.Tensor:
    """The stock output ``[B, 1, N, sum(axes_dims) / 2, 2, 2]`` float32 of ``ids [B, N, A]``."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 3 or ids.shape[-1] != len(seam.axes_dims):
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids has shape {shape}; expected [B, N, {len(seam.axes_dims)}]")
    dtype = torch.float64 if device_has_fp64(ids.device) else torch.float32
    spectra = seam.axis_spectra(extents=lambda: extents_of(ids[0]))
    blocks = []
    for axis, (dim, spectrum) in enumerate(zip(seam.axes_dims, spectra)):
        phases = ids[:, :, axis].unsqueeze(-1) * axis_frequencies(spectrum, dim, seam.theta, dtype, ids.device)
        blocks.append(rotation_matrices(torch.cos(phases), torch.sin(phases), spectrum.magnitude).float())
    return torch.cat(blocks, dim=-3).unsqueeze(1)


PRX = register_family(
    Family(
        name="prx",
        classes=("diffusers.models.transformers.transformer_prx:PRXTransformer2DModel",),
        position_attr="pe_embedder",
        axis_names=("row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.pe_embedder.axes_dim),
        native_theta=lambda model: float(model.pe_embedder.theta),
        image_axes=(0, 1),
        tables=prx_tables,
        tables_key=ids_values_key,
        timestep_per_sigma=1.0,  # the pipelines pass t / num_train_timesteps = sigma
        timestep_arg=("timestep", 1),
        pipelines=("PRXPipeline", "PRXPixelPipeline"),
        train_size=1024,
        pixels_per_token=16,  # latent PRX: 8x VAE, patch 2 (the pixel model: its patch size)
        notes="image tokens only; rotation matrices from float64 phases",
    )
)
