"""Training-time coordinate augmentation of ComRoPE (Yu et al. 2025): jitter each token, shift the grid.

Applied to normalised grid coordinates ``(i + 0.5) / n``: a per-token jitter of
``clamp(N(0, (0.5 * intensity)^2), -0.5, 0.5)`` patches (so a token stays inside its cell) and one global
offset ``N(0, offset_std^2)`` per sample and axis, in normalised units.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .._validation import check_positive_int


def perturb_grid_coords(
    coords: torch.Tensor,
    grid_size: Sequence[int],
    batch_size: int,
    intensity: float = 1.0,
    offset_std: float = 0.0,
    fixed_axes: Sequence[int] = (),
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Perturbed copies of grid coordinates, one per sample.

    Args:
        coords: ``[L, A]`` normalised grid coordinates (fp32/fp64), row-major over ``grid_size``.
        grid_size: cells per axis; one patch is ``1 / grid_size[a]`` along axis ``a``.
        batch_size: samples; each gets its own jitter and offset.
        intensity: jitter scale in patches (the reference's 1.0 is a std of half a patch, clamped at half).
        offset_std: std of the global offset per sample and axis (normalised units).
        fixed_axes: axes left unjittered (the frame axis of videos in the reference).
    Returns:
        ``[batch_size, L, A]`` in ``coords``' dtype; ``coords`` is not modified.
    """
    check_positive_int("batch_size", batch_size)
    grid_size = tuple(grid_size)
    if coords.dim() != 2 or coords.shape[-1] != len(grid_size):
        raise ValueError(
            f"coords has shape {tuple(coords.shape)}; expected [L, {len(grid_size)}] for grid_size {grid_size}"
        )
    if intensity < 0 or offset_std < 0:
        raise ValueError(f"intensity ({intensity}) and offset_std ({offset_std}) must be >= 0")
    shape = (batch_size,) + tuple(coords.shape)
    device = coords.device if generator is None else generator.device
    noise = torch.randn(shape, generator=generator, dtype=coords.dtype, device=device).to(coords.device)
    jitter = (noise * (0.5 * intensity)).clamp(-0.5, 0.5)
    cell = torch.tensor([1.0 / n for n in grid_size], dtype=coords.dtype, device=coords.device)
    jitter = jitter * cell
    if fixed_axes:
        jitter[..., list(fixed_axes)] = 0
    offset = torch.randn((batch_size, 1, len(grid_size)), generator=generator, dtype=coords.dtype, device=device)
    offset = offset.to(coords.device)
    return coords + jitter + offset * offset_std
