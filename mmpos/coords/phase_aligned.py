"""CRPA's coordinates: mixed-resolution tokens expressed on the query's stride.

CRPA (Wu et al. 2025, "One Attention, One Scale", arXiv 2511.19778) mixes tokens of two grids in one attention
(a coarse canvas with a region denoised at ``factor`` times the resolution). Putting every token on one reference
grid (linear interpolation) makes the same physical distance read as ``factor`` times more or fewer RoPE steps than
the model saw for its own neighbours; CRPA instead gives, for each attention call, every query *and* key the
position ``centre / query_stride``: equal physical distances always give the phase steps of the query's own grid.

Units: the coarse grid's token pitch. Coarse token ``(r, c)`` sits at ``(r, c)`` (the stock grid, so a canvas with
no fine region is the stock coordinates bit for bit); a fine token ``(i, j)`` of a region at coarse ``(top, left)``
has its centre at ``top - 1/2 + (i + 1/2) / factor`` (fine cells tile the coarse cells they replace, centres
aligned). The paper leaves the origin open; any origin gives the same relative phases.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.types import Device

from .._validation import check_positive_int


@dataclass(frozen=True)
class MixedGrid:
    """Tokens of several grids on one canvas.

    Attributes:
        centres: ``[L, A]`` float64 token centres in coarse-token units.
        strides: ``[L]`` float64 token pitch in coarse-token units (1 coarse, ``1 / factor`` fine).
    """

    centres: torch.Tensor
    strides: torch.Tensor

    def __post_init__(self) -> None:
        if self.centres.ndim != 2 or self.strides.shape != self.centres.shape[:1]:
            raise ValueError(
                f"centres must be [L, A] and strides [L], got {tuple(self.centres.shape)} and "
                f"{tuple(self.strides.shape)}"
            )
        if not bool((self.strides > 0).all()):
            raise ValueError("strides must be positive")

    def scales(self) -> list[float]:
        """The distinct strides, coarsest first (one attention call each under CRPA)."""
        return sorted({float(s) for s in self.strides.tolist()}, reverse=True)


def mixed_resolution_grid(
    rows: int, cols: int, region: tuple[int, int, int, int] | None, factor: int, device: Device = None
) -> MixedGrid:
    """A ``rows x cols`` coarse canvas whose ``region = (top, left, height, width)`` (coarse tokens) is replaced by
    ``factor * height x factor * width`` fine tokens. Token order: the coarse tokens outside the region
    (row-major), then the fine tokens (row-major). ``region=None``: the coarse grid alone."""
    check_positive_int("rows", rows)
    check_positive_int("cols", cols)
    check_positive_int("factor", factor)
    r, c = torch.meshgrid(
        torch.arange(rows, dtype=torch.float64, device=device),
        torch.arange(cols, dtype=torch.float64, device=device),
        indexing="ij",
    )
    coarse = torch.stack([r, c], dim=-1)
    if region is None:
        centres = coarse.reshape(-1, 2)
        return MixedGrid(centres, torch.ones(len(centres), dtype=torch.float64, device=device))
    top, left, height, width = region
    if not (0 <= top and 0 <= left and height >= 1 and width >= 1 and top + height <= rows and left + width <= cols):
        raise ValueError(f"region (top, left, height, width) must lie inside the {rows} x {cols} grid, got {region}")
    inside = (r >= top) & (r < top + height) & (c >= left) & (c < left + width)
    fine_index = (
        torch.arange(factor * height, dtype=torch.float64, device=device),
        torch.arange(factor * width, dtype=torch.float64, device=device),
    )
    fr, fc = torch.meshgrid(*fine_index, indexing="ij")
    fine = torch.stack([top - 0.5 + (fr + 0.5) / factor, left - 0.5 + (fc + 0.5) / factor], dim=-1).reshape(-1, 2)
    centres = torch.cat([coarse[~inside], fine])
    strides = torch.cat(
        [
            torch.ones(int((~inside).sum()), dtype=torch.float64, device=device),
            torch.full((len(fine),), 1.0 / factor, dtype=torch.float64, device=device),
        ]
    )
    return MixedGrid(centres, strides)


def phase_aligned_positions(grid: MixedGrid, query_stride: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Every token's RoPE position for queries of pitch ``query_stride``: ``centres / query_stride``, ``[L, A]``.

    Linear interpolation onto one reference grid is the same map with one fixed stride for every query; CRPA uses
    the stride of the queries being attended for (one call per stride in :meth:`MixedGrid.scales`)."""
    if not query_stride > 0:
        raise ValueError(f"query_stride must be positive, got {query_stride!r}")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64 for positions, got {dtype}")
    return (grid.centres / query_stride).to(dtype)
