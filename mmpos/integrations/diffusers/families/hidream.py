"""HiDream-I1 (``HiDreamImageTransformer2DModel``): ``HiDreamImageEmbedND``, three axes ``(index, row, col)``,
theta 10000, rotation matrices.

The model calls ``pe_embedder`` once per forward on ``ids [B, S, 3]`` float32: the image ids ``(0, row, col)``
(non-square latents padded with zero ids up to ``max_resolution``) followed by the text ids, all zeros. It
returns 2x2 rotation matrices ``[B, S, 1, D / 2, 2, 2]`` float32 (``[[cos, -sin], [sin, cos]]`` per pair, fp64
phases ``einsum(pos, omega)`` with ``omega = 1 / theta ** (arange(0, d, 2) / d)``, axes concatenated in order).
Text and padding tokens sit at position 0 on every axis (phase 0 whatever the frequency), so the schedule's
extent is the image's rows and columns and non-image tokens are unchanged by any spectrum. The pipelines pass
``timesteps`` = 1000 sigma (the scheduler's timesteps).
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family, SpectrumSeam, extents_of, ids_values_key
from .codecs import axis_frequencies, rotation_matrices


def _stock_rope(model):
    """The stock position module (also while ``set_pe`` has replaced it)."""
    rope = model.pe_embedder
    return rope.stock[0] if isinstance(rope, SpectrumSeam) else rope


def _phases_dtype(device) -> torch.dtype:
    from diffusers.utils.torch_utils import maybe_adjust_dtype_for_device

    return maybe_adjust_dtype_for_device(torch.float64, device)


def hidream_tables(seam, ids: torch.Tensor) -> torch.Tensor:
    """``ids [B, S, A]`` -> rotation matrices ``[B, S, 1, D / 2, 2, 2]`` float32 (the stock module's output)."""
    if ids.dim() != 3 or ids.shape[-1] != len(seam.axes_dims):
        raise ValueError(f"ids have shape {tuple(ids.shape)}; expected [B, S, {len(seam.axes_dims)}] (index, row, col)")
    spectra = seam.axis_spectra(extents=lambda: extents_of(ids) if ids.numel() else None)
    dtype = _phases_dtype(ids.device)
    blocks = []
    for axis, (dim, spectrum) in enumerate(zip(seam.axes_dims, spectra)):
        omega = axis_frequencies(spectrum, dim, seam.theta, dtype, ids.device)
        phases = torch.einsum("...n,d->...nd", ids[..., axis], omega)
        blocks.append(rotation_matrices(phases.cos(), phases.sin(), spectrum.magnitude).float())
    return torch.cat(blocks, dim=-3).unsqueeze(2)


HIDREAM = register_family(
    Family(
        name="hidream",
        classes=("diffusers.models.transformers.transformer_hidream_image:HiDreamImageTransformer2DModel",),
        position_attr="pe_embedder",
        axis_names=("index", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in _stock_rope(model).axes_dim),
        native_theta=lambda model: float(_stock_rope(model).theta),
        image_axes=(1, 2),
        tables=hidream_tables,
        tables_key=ids_values_key,
        timestep_per_sigma=1000.0,  # HiDreamImagePipeline passes the scheduler's timesteps (1000 sigma)
        timestep_arg=("timesteps", 1),
        pipelines=("HiDreamImagePipeline",),
        train_size=1024,
        pixels_per_token=16,
        notes="rotation matrices [B, S, 1, D/2, 2, 2]; text and padding at position 0",
    )
)
