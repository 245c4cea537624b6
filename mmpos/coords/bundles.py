"""HRDiT's SPA coordinates: image rows and columns replaced by bundle indices, one grid per boundary offset.

SPA (Spatial Position Alignment, HRDiT, arXiv 2608.07003) maps each row (and column) index ``x`` of a grid larger
than the training grid to the index of its bundle of ``size`` consecutive rows, ``0`` for ``x < start`` and
``ceil((x + 1 - start) / size)`` after, so that the bundled positions stay within the trained range; the attention is
then averaged over several such grids whose bundle boundaries slide (:func:`bundle_variants`). Re-derived from the
authors' code (github.com/zylwithxy/HRDiT, ``hrdit/spa.py``): ``size = max(1, ceil(max_index / (group_num - 1)))``
per axis; the variants are ``(start_row, start_col) = (size_row, size_col)``, then ``(n, size_col)`` for
``n = 1 .. size_row - 1``, then ``(size_row, m)`` for ``m = 1 .. size_col - 1``. A grid of at most ``group_num``
rows and columns has ``size = 1`` and one variant: the grid itself.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_positive_int


def bundle_index(index: torch.Tensor, start: int, size: int) -> torch.Tensor:
    """``0`` where ``index < start``, else ``ceil((index + 1 - start) / size)`` (integer-valued, ``index``'s dtype)."""
    whole = index.long()
    bundled = torch.div(whole + 1 - start + size - 1, size, rounding_mode="floor")
    return torch.where(whole < start, torch.zeros_like(whole), bundled).to(index.dtype)


def bundle_sizes(coords: torch.Tensor, group_num: int) -> tuple[int, int]:
    """Rows and columns per bundle for ``coords [L, 2]`` (integer-valued row, column) and ``group_num`` bundles."""
    check_positive_int("group_num", group_num)
    if group_num < 2:
        raise ValueError(f"group_num must be at least 2 (bundles per axis), got {group_num}")
    return tuple(max(1, math.ceil(int(coords[:, a].max()) / (group_num - 1))) for a in range(2))  # type: ignore[return-value]


def bundle_variants(coords: torch.Tensor, group_num: int) -> list[torch.Tensor]:
    """SPA's grids for ``coords [L, 2]`` (row, column; integer-valued, from 0): ``1 + (size_row - 1) + (size_col
    - 1)`` tensors ``[L, 2]`` of bundle indices, in the authors' order."""
    if coords.ndim != 2 or coords.shape[1] != 2:
        raise ValueError(f"coords must be [L, 2] (row, column), got {tuple(coords.shape)}")
    if not bool((coords == coords.round()).all()) or bool((coords < 0).any()):
        raise ValueError("coords must hold non-negative integer rows and columns (SPA bundles grid indices)")
    rows, cols = bundle_sizes(coords, group_num)

    def variant(start_row: int, start_col: int) -> torch.Tensor:
        return torch.stack(
            [bundle_index(coords[:, 0], start_row, rows), bundle_index(coords[:, 1], start_col, cols)], dim=-1
        )

    starts = [(rows, cols), *((n, cols) for n in range(1, rows)), *((rows, m) for m in range(1, cols))]
    return [variant(r, c) for r, c in starts]
