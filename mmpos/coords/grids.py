"""Coordinate builders: pure functions returning ``[L, A]`` float tensors (fp32 by default, never 16-bit).

Token order is row-major over the grid (last axis fastest), as patchified images and videos are.
Prefix tokens (cls, registers, text) get no coordinates here: rotary encodings skip them
(``num_prefix_tokens``), so their count is never hidden inside the coordinates.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch.types import Device

from .._validation import check_choice, check_non_negative_int, check_positive_int, per_axis

MODES = ("index", "centered", "normalized")
PerAxis = float | Sequence[float]  # one value for every axis, or one per axis


def axis_positions(
    size: int,
    mode: str = "index",
    offset: float = 0.0,
    scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """Positions along one axis, ``[size]``.

    Modes: ``index`` gives ``0 .. size-1``; ``centered`` gives ``i - (size - 1) / 2`` (symmetric about 0);
    ``normalized`` gives cell centres ``(i + 0.5) / size`` in ``(0, 1)`` (ComRoPE). Then
    ``position * scale + offset``.
    """
    check_positive_int("size", size)
    check_choice("mode", mode, MODES)
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64 for positions, got {dtype}")
    index = torch.arange(size, dtype=torch.float64, device=device)
    if mode == "centered":
        index = index - (size - 1) / 2
    elif mode == "normalized":
        index = (index + 0.5) / size
    return (index * scale + offset).to(dtype)


def grid_coords(
    shape: Sequence[int],
    mode: str = "index",
    offset: PerAxis = 0.0,
    scale: PerAxis = 1.0,
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """Coordinates of every cell of an N-D grid, ``[prod(shape), len(shape)]``, row-major.

    ``offset`` and ``scale`` are one value or one per axis (position interpolation is ``scale=1/factor``).
    """
    shape = tuple(shape)
    if not shape:
        raise ValueError("shape must have at least one axis")
    offsets = per_axis("offset", offset, len(shape))
    scales = per_axis("scale", scale, len(shape))
    for name, given, values in (("offset", offset, offsets), ("scale", scale, scales)):
        if not torch.compiler.is_compiling() and not all(math.isfinite(float(v)) for v in values):
            raise ValueError(f"{name}={given!r}: expected finite numbers")  # (traced: symbolic under dynamic=True)
    axes = [axis_positions(n, mode, o, s, dtype, device) for n, o, s in zip(shape, offsets, scales)]
    mesh = torch.meshgrid(*axes, indexing="ij")
    return torch.stack(mesh, dim=-1).reshape(-1, len(shape))


def grid_rows(
    shape: Sequence[int], start: int, stop: int, dtype: torch.dtype = torch.float32, device: Device = None
) -> torch.Tensor:
    """Rows ``start:stop`` of ``grid_coords(shape)`` (index mode), ``[stop - start, len(shape)]``, built without the
    rest of the grid (a context-parallel rank's share of a model's grid)."""
    shape = tuple(int(n) for n in shape)
    total = math.prod(shape)
    if not 0 <= start <= stop <= total:
        raise ValueError(f"rows {start}:{stop} are outside the {total} cells of the grid {shape}")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64 for positions, got {dtype}")
    index = torch.arange(start, stop, device=device)
    axes = []
    for n in reversed(shape):
        axes.append(index % n)
        index = index // n
    return torch.stack(axes[::-1], dim=-1).to(dtype)


def positions_1d(
    length: int, offset: float = 0.0, scale: float = 1.0, dtype: torch.dtype = torch.float32, device: Device = None
) -> torch.Tensor:
    """Sequence positions ``[length, 1]``: ``offset + scale * i``."""
    return grid_coords((length,), "index", offset, scale, dtype, device)


def image_grid(
    height: int,
    width: int,
    mode: str = "index",
    offset: PerAxis = 0.0,
    scale: PerAxis = 1.0,
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """(row, col) coordinates of an image's patch grid, ``[height * width, 2]``."""
    return grid_coords((height, width), mode, offset, scale, dtype, device)


def video_grid(
    frames: int,
    height: int,
    width: int,
    mode: str = "index",
    offset: PerAxis = 0.0,
    scale: PerAxis = 1.0,
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """(t, row, col) coordinates of a video's patch grid, ``[frames * height * width, 3]``."""
    return grid_coords((frames, height, width), mode, offset, scale, dtype, device)


def flux_ids(
    height: int,
    width: int,
    text_length: int = 0,
    index: float = 0.0,
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """Flux-style ids ``[text_length + height * width, 3]``: text tokens at (0, 0, 0), image tokens at
    ``(index, row, col)`` (Kontext puts its context image at ``index=1``)."""
    check_non_negative_int("text_length", text_length)
    image = grid_coords((height, width), dtype=dtype, device=device)
    image = torch.cat([torch.full_like(image[:, :1], index), image], dim=-1)
    text = torch.zeros(text_length, 3, dtype=dtype, device=device)
    return torch.cat([text, image])
