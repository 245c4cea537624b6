"""Absolute encodings added to tokens: ``ape_sincos`` (fixed) and ``ape_learned`` (with resampling).

``x = pe(x, coords)`` adds ``pe.embed(coords)`` to the tokens after ``num_prefix_tokens`` prefix tokens
(cls, registers), which are left unchanged. ``x``: ``[B, L, C]``; coords: ``[L', A]`` or ``[B, L', A]``.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._validation import check_choice, check_non_negative_int, check_positive_int, check_theta
from ..ops.tables import check_coords
from .base import Capabilities, PEKind, PositionalEncoding
from .registry import register_pe


class AbsolutePE(PositionalEncoding):
    """Base of absolute encodings: subclasses implement :meth:`embed`; the base adds it after the prefix."""

    kind = PEKind.ABSOLUTE
    capabilities = Capabilities(reads_image_grid=True)

    def __init__(self, embed_dim: int, num_axes: int, num_prefix_tokens: int):
        super().__init__()
        check_positive_int("embed_dim", embed_dim)
        check_positive_int("num_axes", num_axes)
        check_non_negative_int("num_prefix_tokens", num_prefix_tokens)
        self.embed_dim, self.num_axes, self.num_prefix_tokens = embed_dim, num_axes, num_prefix_tokens

    def embed(self, coords: torch.Tensor) -> torch.Tensor:
        """``[..., L, embed_dim]`` embeddings of ``coords`` ``[..., L, A]``."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"x has shape {tuple(x.shape)}; expected [B, L, {self.embed_dim}]")
        coords = check_coords(coords, self.num_axes)
        n = self.num_prefix_tokens
        if coords.shape[-2] != x.shape[1] - n:
            raise ValueError(f"coords has {coords.shape[-2]} positions; x has {x.shape[1]} tokens with {n} prefix")
        emb = self.embed(coords.to(x.device)).to(x.dtype)
        return torch.cat([x[:, :n], x[:, n:] + emb], dim=1)


@register_pe("ape_sincos")
class SinCosAPE(AbsolutePE):
    """Fixed sin-cos embedding (Transformer, MAE/DiT 2D, 3D for video): axis ``a`` owns channel block ``a``
    of ``embed_dim / A`` channels, ``[sin(c w_i), cos(c w_i)]`` with ``w_i = theta ** (-i / (d_a / 2))``.

    Note MAE and diffusers' ``get_2d_sincos_pos_embed`` put the column (w) axis first: pass ``(col, row)``
    coordinates to reproduce them.
    """

    description = "Fixed sin-cos absolute embedding in 1D, 2D or 3D (Transformer, MAE, DiT)."

    example_options = dict(embed_dim=16)

    def __init__(self, embed_dim: int, num_axes: int = 2, theta: float = 10000.0, num_prefix_tokens: int = 0):
        super().__init__(embed_dim, num_axes, num_prefix_tokens)
        if embed_dim % (2 * num_axes):
            raise ValueError(f"embed_dim={embed_dim} must be divisible by 2 * num_axes = {2 * num_axes}")
        check_theta("theta", theta)
        self.theta = theta

    def embed(self, coords: torch.Tensor) -> torch.Tensor:
        coords = check_coords(coords, self.num_axes)
        half = self.embed_dim // self.num_axes // 2
        omega = 1.0 / self.theta ** (torch.arange(half, dtype=torch.float64, device=coords.device) / half)
        with torch.autocast(coords.device.type, enabled=False):
            out = coords.to(torch.float64).unsqueeze(-1) * omega  # [..., L, A, half]
            emb = torch.cat([out.sin(), out.cos()], dim=-1).flatten(-2)
        return emb.float()


@register_pe("ape_learned")
class LearnedAPE(AbsolutePE):
    """Learned embedding on a fixed grid, ``weight`` ``[*grid_size, embed_dim]``.

    ``embed(coords)``: integer coordinates inside the grid look the table up exactly; fractional or
    out-of-grid ones (2D) are interpolated bilinearly (``align_corners`` semantics: index ``i`` is node ``i``).
    ``resample(grid_size)``: the table for another grid, like timm's ``resample_abs_pos_embed``.
    """

    description = "Learned absolute embedding on a fixed patch grid, resampled to other grids."

    example_options = dict(embed_dim=16, grid_size=(4, 4))
    capabilities = Capabilities(learnable=True, reads_image_grid=True)

    def __init__(
        self,
        embed_dim: int,
        grid_size: Sequence[int],
        num_prefix_tokens: int = 0,
        init_std: float = 0.02,
        interpolation: str = "bicubic",
    ):
        grid_size = tuple(int(g) for g in grid_size)
        if not grid_size or any(g <= 0 for g in grid_size):
            raise ValueError(f"grid_size must be positive integers, got {grid_size}")
        super().__init__(embed_dim, len(grid_size), num_prefix_tokens)
        check_choice("interpolation", interpolation, ("bilinear", "bicubic", "nearest"))
        self.grid_size, self.interpolation = grid_size, interpolation
        self.weight = nn.Parameter(torch.randn(*grid_size, embed_dim) * init_std)

    def embed(self, coords: torch.Tensor) -> torch.Tensor:
        coords = check_coords(coords, self.num_axes)
        limits = torch.tensor(self.grid_size, device=coords.device) - 1
        integral = bool(((coords == coords.round()) & (coords >= 0) & (coords <= limits)).all())
        if integral:
            index = coords.long().unbind(-1)
            return self.weight[index]
        if self.num_axes != 2:
            raise ValueError("ape_learned interpolates fractional coordinates only on 2D grids")
        return self._sample_2d(coords)

    def _sample_2d(self, coords: torch.Tensor) -> torch.Tensor:
        """Bilinear lookup of fractional 2D ``coords [..., L, 2]`` -> ``[..., L, embed_dim]`` (border clamped)."""
        h, w = self.grid_size
        lead = coords.shape[:-2]
        flat = coords.reshape(1, -1, 1, 2).to(self.weight.dtype)
        norm = torch.stack([flat[..., 1] / max(w - 1, 1), flat[..., 0] / max(h - 1, 1)], dim=-1) * 2 - 1
        table = self.weight.permute(2, 0, 1)[None]
        out = F.grid_sample(table, norm, mode="bilinear", padding_mode="border", align_corners=True)
        return out[0, :, :, 0].transpose(0, 1).reshape(*lead, coords.shape[-2], self.embed_dim)

    def resample(self, grid_size: Sequence[int]) -> torch.Tensor:
        """``[prod(grid_size), embed_dim]`` table for another grid (2D: antialiased ``interpolation``)."""
        grid_size = tuple(int(g) for g in grid_size)
        if len(grid_size) != self.num_axes:
            raise ValueError(f"grid_size {grid_size} must have {self.num_axes} axes")
        if grid_size == self.grid_size:
            return self.weight.reshape(-1, self.embed_dim)
        table = self.weight.movedim(-1, 0)[None].float()
        mode = {1: "linear", 2: self.interpolation, 3: "trilinear"}[self.num_axes]
        if self.num_axes != 2 and self.interpolation == "nearest":
            mode = "nearest"
        antialias = mode in ("bilinear", "bicubic")
        out = F.interpolate(
            table, size=grid_size, mode=mode, align_corners=False if mode != "nearest" else None, antialias=antialias
        )
        return out[0].movedim(0, -1).reshape(-1, self.embed_dim).to(self.weight.dtype)
