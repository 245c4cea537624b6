"""Base of learned block-rotation encodings (ComRoPE, LieRE): ``q -> R(x) q`` with ``R(x)`` block-diagonal.

Channels split into ``m = head_dim / b`` contiguous blocks of ``b``; each head and block has its own learned
rotation per token. Blocks of 2 are planar rotations and use the RoPE table and kernel
(:func:`~mmpos.ops.rotation.rotate`); larger blocks use :class:`~mmpos.ops.block_rotation.BlockRotationTable`.

Coordinates follow ComRoPE: with ``grid_size`` set, the default coordinates are the normalised cell centres
``(i + 0.5) / n`` (any resolution maps into ``(0, 1)``), ``prefix_at_centre`` rotates the prefix tokens (cls)
at the centre of the grid instead of leaving them unrotated, and ``perturbation`` / ``offset_std`` jitter
the default coordinates in training mode (:func:`~mmpos.coords.perturb.perturb_grid_coords`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch
from torch import nn
from torch.types import Device

from .._validation import check_positive_int
from ..coords.grids import grid_coords
from ..coords.perturb import perturb_grid_coords
from ..ops.block_rotation import apply_block_rotation
from ..ops.tables import RotaryTable, device_has_fp64
from .rotary_base import RotaryPE, Table


class BlockRotaryPE(RotaryPE):
    """Shared options and plumbing; subclasses implement :meth:`compute_table` (from :meth:`angle_inputs`) and
    :meth:`frequency_matrix`.

    Tables are cached by the base (key: the parameters' versions, :meth:`RotaryPE.table_key`), never while a
    gradient is needed.
    """

    cache_entries = 4

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        num_axes: int,
        block_size: int,
        layout: str,
        num_prefix_tokens: int,
        seq_dim: int,
        grid_size: Sequence[int] | None,
        prefix_at_centre: bool,
        perturbation: float,
        offset_std: float,
    ):
        super().__init__(head_dim, num_axes, layout, num_prefix_tokens, seq_dim)
        check_positive_int("num_heads", num_heads)
        check_positive_int("num_axes", num_axes)
        check_positive_int("block_size", block_size)
        if block_size < 2 or head_dim % block_size:
            raise ValueError(f"block_size={block_size} must be >= 2 and divide head_dim={head_dim}")
        if block_size > 2 and layout != "interleaved":
            raise ValueError(
                f"layout={layout!r} pairs channels (i, i + D/2), which only exists for block_size=2; "
                f"blocks of {block_size} are contiguous channels: use layout='interleaved'"
            )
        if grid_size is not None:
            grid_size = tuple(check_positive_int(f"grid_size[{i}]", n) for i, n in enumerate(grid_size))
            if len(grid_size) != num_axes:
                raise ValueError(f"grid_size={grid_size} has {len(grid_size)} axes; expected num_axes={num_axes}")
        if not perturbation >= 0 or not offset_std >= 0:
            raise ValueError(f"perturbation ({perturbation}) and offset_std ({offset_std}) must be >= 0")
        if (perturbation or offset_std) and grid_size is None:
            raise ValueError("perturbation and offset_std jitter the encoding's own grid: set grid_size")
        self.num_heads, self.block_size, self.num_blocks = num_heads, block_size, head_dim // block_size
        self.grid_size, self.prefix_at_centre = grid_size, bool(prefix_at_centre)
        self.perturbation, self.offset_std = float(perturbation), float(offset_std)
        self.capabilities = replace(type(self).capabilities, jitters_coords=bool(perturbation or offset_std))

    def init_skew_parameter(self, shape: tuple, init_std: float, seed: int | None) -> torch.Generator | None:
        """Create ``P ~ N(0, init_std^2)`` of ``shape`` (only ``P - P^T`` is used); returns the generator."""
        if not init_std >= 0:
            raise ValueError(f"init_std must be >= 0, got {init_std}")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.P = nn.Parameter(torch.randn(shape, generator=generator) * init_std)
        return generator

    # ----- tables -----------------------------------------------------------------------------------------
    def angle_inputs(
        self, coords: torch.Tensor, complex_dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.dtype, torch.dtype]:
        """``(coords, real_dtype, work_dtype)`` for :meth:`compute_table`: the coordinates with the prefix tokens'
        centre prepended (``prefix_at_centre``), cast to ``work_dtype``, the precision of the angles (the
        parameters': an fp64 product of fp32 parameters adds nothing they hold); ``real_dtype`` is the table's.
        Subclasses compute the table from them with autocast off."""
        if self.prefix_at_centre and self.num_prefix_tokens:
            coords = _prepend_centre(coords, self.num_prefix_tokens)
        real = torch.float64 if complex_dtype == torch.complex128 else torch.float32
        work = torch.float64 if self.P.dtype == torch.float64 and device_has_fp64(coords.device) else torch.float32
        return coords.to(work), real, work

    @property
    def rotated_prefix(self) -> int:
        """Leading tokens left unrotated."""
        return 0 if self.prefix_at_centre else self.num_prefix_tokens

    def check_rotatable(self, x: torch.Tensor, table: Table | None = None) -> None:
        super().check_rotatable(x, table)
        heads, other = (x.shape[-2], x.shape[-3]) if self.seq_dim == -3 else (x.shape[-3], x.shape[-2])
        if heads != self.num_heads:
            hint = (
                ""
                if other != self.num_heads
                else (
                    f"; x {tuple(x.shape)} looks like "
                    + (
                        "[B, H, L, D] (the default layout): pass seq_dim=-2"
                        if self.seq_dim == -3
                        else "[B, L, H, D] (diffusers' Flux / Wan layout): pass seq_dim=-3"
                    )
                )
            )
            raise ValueError(
                f"x has {heads} heads; this encoding has per-head parameters for num_heads={self.num_heads}{hint}"
            )

    def rotate(self, x: torch.Tensor, table: Table) -> torch.Tensor:
        if isinstance(table, RotaryTable):
            return super().rotate(x, table)
        self.check_rotatable(x)
        return apply_block_rotation(x, table, seq_dim=self.seq_dim, num_prefix_tokens=self.rotated_prefix)

    # ----- coordinates ------------------------------------------------------------------------------------
    def default_coords(self, length: int, device: Device) -> torch.Tensor:
        if self.grid_size is None:
            return super().default_coords(length, device)
        expected = 1
        for n in self.grid_size:
            expected *= n
        if length != expected:
            raise ValueError(
                f"{length} tokens after {self.num_prefix_tokens} prefix token(s) do not match "
                f"grid_size={self.grid_size} ({expected} cells)"
            )
        return grid_coords(self.grid_size, "normalized", dtype=torch.float64, device=device)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor | None, coords: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As :meth:`RotaryPE.forward`; in training with ``perturbation`` / ``offset_std`` the encoding jitters its
        own grid (``coords`` must then be ``None``)."""
        if self.training and (self.perturbation or self.offset_std):
            if coords is not None:
                raise ValueError(
                    "training-time perturbation jitters the encoding's own grid; call with coords=None "
                    "or perturb your coordinates with mmpos.coords.perturb_grid_coords"
                )
            grid = self.default_coords(q.shape[self.seq_dim] - self.num_prefix_tokens, q.device)
            fixed = (0,) if self.num_axes == 3 else ()  # the reference never jitters the frame axis
            assert self.grid_size is not None  # __init__ refuses perturbation without a grid_size
            coords = perturb_grid_coords(grid, self.grid_size, q.shape[0], self.perturbation, self.offset_std, fixed)
        return super().forward(q, k, coords)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", num_heads={self.num_heads}, block_size={self.block_size}"


def _prepend_centre(coords: torch.Tensor, count: int) -> torch.Tensor:
    """Put ``count`` tokens at the centre ``(min + max) / 2`` of the grid (per sample), before the grid."""
    centre = (coords.amin(dim=-2, keepdim=True) + coords.amax(dim=-2, keepdim=True)) / 2
    return torch.cat([centre.expand(*coords.shape[:-2], count, coords.shape[-1]), coords], dim=-2)
