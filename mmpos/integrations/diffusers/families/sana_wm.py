"""SANA-WM (``SanaWMTransformer3DModel``, the bidirectional camera-controlled world model): ``SanaWMRotaryPosEmbed``.

The model calls ``rope((frames, rows, cols), device=...)`` once per forward (unless the caller passes ``pos_embeds``).
The stock module precomputes a complex64 table on the CPU at construction (``get_1d_rotary_pos_embed(d_a, 1024,
10000, use_real=False)`` per axis, float32 ladders ``theta ** (-2i / d_a)``; ``d_h = d_w = 2 (head_dim // 6)``, ``d_t``
the rest of ``linear_head_dim``), holds it outside the buffers (a ``.to(dtype)`` would drop its imaginary half) and
slices it to the patch grid: ``[1, 1, F H W, head_dim / 2]`` of ``cat(t, h, w)`` polar pairs, positions from 0.
Here :class:`~.codecs.PrecomputedRows` gives the same CPU arithmetic (grown, not walled at 1024 positions); a
schedule's extents are the patch grid in tokens.

The camera branch (UCPE: per-pixel ``ray <- world`` matrices from unified-camera intrinsics applied as ``P^T q`` /
``P^-1 kv``, the first half of each head; and Plücker raymaps after attention) reads the rotary table the seam builds
(its second half rotates with ``_slice_rope_for_cam`` of it), so an extrapolation reaches it too; the camera geometry
itself stays stock. mmpos' ``ucpe`` ray matrices and ``plucker`` rays equal SANA-WM's in float64; its latitude / up
map differs from SANA-WM's by a spurious term of SANA-WM's Rodrigues rotation only
(``tests/integrations/test_sana_wm_cameras.py``).

The pipeline passes per-frame timesteps ``(B, 1, T)`` = 1000 sigma with conditioning frames pinned at 0: sigma is
read from the noisiest frame. No context-parallel plan in diffusers: refused by name.
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family, SpectrumSeam
from .codecs import complex_pairs, precomputed_rows


def _stock(model):
    rope = model.rope
    return rope.stock[0] if isinstance(rope, SpectrumSeam) else rope


def _axes_dims(model):
    head_dim = int(_stock(model).attention_head_dim)
    spatial = 2 * (head_dim // 6)
    return (head_dim - 2 * spatial, spatial, spatial)


def sana_wm_tables(seam, fhw, device=None) -> torch.Tensor:
    """The stock complex64 table ``[1, 1, F H W, head_dim / 2]`` of a ``(frames, rows, cols)`` patch grid."""
    if not isinstance(fhw, (tuple, list)) or len(fhw) != 3:
        raise ValueError(f"fhw must be (frames, rows, cols) patch counts, got {fhw!r}")
    sizes = tuple(int(n) for n in fhw)
    grids = torch.meshgrid(*[torch.arange(n) for n in sizes], indexing="ij")
    pos = torch.stack(grids, dim=-1).reshape(-1, 3)  # integer (t, row, col), on the CPU as the stock table
    spectra = seam.axis_spectra(extents=[float(n) for n in sizes])
    rows = precomputed_rows(seam, freqs_dtype=torch.float32)
    table = complex_pairs(pos, spectra, seam.axes_dims, seam.theta, torch.float32, rows=rows)
    return table.to(device).reshape(1, 1, pos.shape[0], -1)


SANA_WM = register_family(
    Family(
        name="sana_wm",
        classes=("diffusers.models.transformers.transformer_sana_wm:SanaWMTransformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=_axes_dims,
        native_theta=lambda model: 10000.0,  # SanaWMRotaryPosEmbed's default; the model never passes another
        image_axes=(1, 2),
        time_axis=0,
        tables=sana_wm_tables,
        timestep_per_sigma=1000.0,  # SanaWMPipeline: per-frame 1000 sigma, conditioning frames at 0
        timestep_arg=("timestep", 1),
        pipelines=("SanaWMPipeline",),
        train_size=720,  # image_size of the released config
        pixels_per_token=32,  # LTX-2 VAE 32 x patch 1
        notes="complex table past 1024 positions computed; the UCPE / Plücker camera branch reads the seam's table",
    )
)
