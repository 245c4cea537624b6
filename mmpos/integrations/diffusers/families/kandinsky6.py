"""Kandinsky 6 (``Kandinsky6Transformer3DModel``, text/image-to-video-and-audio): ``Kandinsky6RoPE3D`` on the video
tokens, three axes ``(t, row, col)``, max period 10000, rotation matrices.

The model calls ``visual_rope_embeddings(visual_rope_pos, scale_factor)`` once per forward: one integer index tensor
per axis (``arange`` of the patch grid; image-to-video appends a reference frame at ``t = 0``) and the per-axis
``scale_factor`` of the config (``(1, 2, 2)``: rows and columns turn at half the rate). The stock module looks the
angles up in float32 buffers ``outer(arange(128), freq)`` (a wall at 128 positions per axis) and divides them by
``scale_factor``; here they are computed from the positions (``outer(pos, freq) / scale_factor``, the same
float32 products, cast to the buffers' dtype as the stock lookup is after ``model.to(dtype)``), so larger grids
just work. ``freq = exp(-ln(10000) * arange(d / 2) / (d / 2))`` float32 is the
``theta ** (-2i / d)`` ladder; output ``[T, H, W, 1, D / 2, 2, 2]`` (``[[cos, -sin], [sin, cos]]``). The schedule's
extent is the positions' span in tokens (the unit of ``trained_grid``); its frequencies are per index, before the
division by ``scale_factor`` (so YaRN's turn thresholds count ``scale_factor`` times the true turns on rows and
columns). The text and audio ropes (``*_text_rope_embeddings``, ``audio_rope_embeddings``: 1D) stay stock.
"""

from __future__ import annotations

import math

import torch

from . import register_family
from .base import Family, SpectrumSeam, ids_values_key
from .codecs import axis_frequencies, rotation_matrices


def _stock_rope(model):
    """The stock position module (also while ``set_pe`` has replaced it)."""
    rope = model.visual_rope_embeddings
    return rope.stock[0] if isinstance(rope, SpectrumSeam) else rope


def k6_ladder(dim: int, theta: float, dtype: torch.dtype, device=None) -> torch.Tensor:
    """``get_freqs(dim // 2, theta)``: ``exp(-ln(theta) * arange(dim / 2) / (dim / 2))`` float32 (the stock dtype)."""
    half = dim // 2
    return torch.exp(-math.log(theta) * torch.arange(start=0, end=half, dtype=torch.float32, device=device) / half)


def _check_positions(pos, num_axes: int) -> None:
    if (
        not isinstance(pos, (tuple, list))
        or len(pos) != num_axes
        or not all(isinstance(p, torch.Tensor) and p.dim() == 1 for p in pos)
    ):
        raise ValueError(
            f"pos must be {num_axes} one-dimensional index tensors (t, row, col), got "
            f"{[tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__ for p in pos]}"
            if isinstance(pos, (tuple, list))
            else f"pos must be a tuple of {num_axes} index tensors, got {type(pos).__name__}"
        )


def kandinsky6_tables(seam, pos, scale_factor=(1.0, 1.0, 1.0)) -> torch.Tensor:
    """``pos``: ``(t [T], row [H], col [W])`` indices -> ``[T, H, W, 1, D / 2, 2, 2]`` float32 (the stock output)."""
    _check_positions(pos, len(seam.axes_dims))
    spectra = seam.axis_spectra(extents=lambda: [float(p.max() - p.min()) + 1.0 if p.numel() else 0.0 for p in pos])
    sizes = tuple(int(p.shape[0]) for p in pos)
    blocks = []
    for axis, (dim, spectrum, p) in enumerate(zip(seam.axes_dims, spectra, pos)):
        freq = axis_frequencies(spectrum, dim, seam.theta, torch.float32, p.device, stock_ladder=k6_ladder)
        buffer_dtype = seam.native_dtype_probe.dtype  # the stock buffers' dtype: bf16 after model.to(bfloat16)
        angles = torch.outer(p.to(torch.float32), freq).to(buffer_dtype) / scale_factor[axis]  # (n, d / 2)
        shape = [1, 1, 1, -1]
        shape[axis] = sizes[axis]
        angles = angles.view(*shape).expand(*sizes, -1)
        blocks.append(rotation_matrices(torch.cos(angles), torch.sin(angles), spectrum.magnitude))
    return torch.cat(blocks, dim=-3).unsqueeze(-4)


KANDINSKY6 = register_family(
    Family(
        name="kandinsky6",
        classes=("diffusers.models.transformers.transformer_kandinsky6:Kandinsky6Transformer3DModel",),
        position_attr="visual_rope_embeddings",
        axis_names=("t", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in _stock_rope(model).axes_dims),
        native_theta=lambda model: float(_stock_rope(model).max_period),
        image_axes=(1, 2),
        time_axis=0,
        tables=kandinsky6_tables,
        tables_key=ids_values_key,
        cast_probe="angles_0",  # the tables follow the stock buffers' casts
        timestep_per_sigma=1000.0,  # the pipelines pass the scheduler's timesteps, on the [0, 1000] scale
        timestep_arg=("timestep", 3),
        pipelines=("Kandinsky6TI2VAPipeline",),  # the SR model is its own class (Kandinsky6SRTransformer3DModel)
        train_size=512,
        pixels_per_token=16,  # VAE 8 x patch 2
        notes="rotation matrices; positions beyond the 128-entry buffers computed; per-axis scale_factor kept",
    )
)
