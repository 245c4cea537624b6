"""RoPE-Mixed (Heo et al. 2024, arXiv 2403.13298): learned per-head frequency directions.

Pair ``p`` of head ``h`` turns at ``phase = sum_a coords[a] * freqs[h, a, p]``: a 2D frequency vector per
pair, learned. Initialisation follows the paper: magnitudes ``theta ** (-4j / head_dim)`` for the first
half of the pairs along a random direction per head, the second half along the perpendicular direction.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .._validation import check_even, check_positive_int, check_theta
from ..ops.phasors import unit_phasor_table
from ..ops.tables import RotaryTable
from .base import Capabilities
from .registry import register_pe
from .rotary_base import RotaryPE


@register_pe("rope_mixed")
class MixedRoPE(RotaryPE):
    """Args:
        head_dim: channels per head (multiple of 4 for the 2-axis init).
        num_heads: heads; each gets its own frequencies.
        num_axes: coordinate axes (2 for images; other counts use random unit directions per pair).
        theta: magnitude base (10 in the paper and timm).
        rotate: random direction per head (``False``: axis-aligned, x then y).
        layout, num_prefix_tokens, seq_dim: as :class:`~mmpos.encodings.rope_axial.AxialRoPE`.
        seed: seed of the random directions (``None`` uses the global generator).
    The parameter ``freqs`` is ``[num_heads, num_axes, head_dim // 2]``; list it in ``no_weight_decay``.
    """

    description = "RoPE-Mixed: learned per-head 2D frequency directions (RoPE-ViT)."

    example_options = dict(head_dim=16, num_heads=2, seed=0)
    capabilities = Capabilities(relative=True, learnable=True, per_head_tables=True, reads_image_grid=True)
    cache_entries = 4

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        num_axes: int = 2,
        theta: float = 10.0,
        rotate: bool = True,
        layout: str = "interleaved",
        num_prefix_tokens: int = 0,
        seq_dim: int = -2,
        seed: int | None = None,
    ):
        super().__init__(head_dim, num_axes, layout, num_prefix_tokens, seq_dim)
        check_even("head_dim", head_dim)
        if num_axes == 2 and head_dim % 4:
            raise ValueError(f"head_dim must be a multiple of 4 for 2-axis RoPE-Mixed, got {head_dim}")
        check_positive_int("num_heads", num_heads)
        check_theta("theta", theta)
        self.num_heads = num_heads
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.freqs = nn.Parameter(init_mixed_freqs(head_dim, num_heads, num_axes, theta, rotate, generator))

    def compute_table(self, coords: torch.Tensor, complex_dtype: torch.dtype) -> RotaryTable:
        with torch.autocast(coords.device.type, enabled=False):
            freqs = self.freqs.to(coords.device, torch.float64)
            phase = torch.einsum("...la,hap->...hlp", coords.to(torch.float64), freqs)
        return unit_phasor_table(phase, complex_dtype)  # training: one backward for q and k (rotate_pair)

    def frequency_matrix(self) -> torch.Tensor:
        return self.freqs.detach().to(torch.float64)

    def no_weight_decay(self) -> set[str]:
        """Parameter names an optimiser should not decay (timm's hook)."""
        return {"freqs"}


def init_mixed_freqs(
    head_dim: int,
    num_heads: int,
    num_axes: int = 2,
    theta: float = 10.0,
    rotate: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``[num_heads, num_axes, head_dim // 2]`` fp32 initial frequency vectors."""
    num_pairs = head_dim // 2
    if num_axes != 2:
        mag = theta ** (-torch.arange(num_pairs, dtype=torch.float64) * 2 / head_dim)
        direction = torch.randn(num_heads, num_axes, num_pairs, generator=generator, dtype=torch.float64)
        direction = direction / direction.norm(dim=1, keepdim=True)
        return (direction * mag).float()
    mag = theta ** (-torch.arange(0, head_dim, 4, dtype=torch.float64) / head_dim)  # [P / 2]
    if rotate:
        angle = torch.rand(num_heads, 1, generator=generator, dtype=torch.float64) * 2 * math.pi
    else:
        angle = torch.zeros(num_heads, 1, dtype=torch.float64)
    angles = torch.cat([angle.expand(-1, mag.numel()), (angle + math.pi / 2).expand(-1, mag.numel())], dim=-1)
    mags = torch.cat([mag, mag])
    return torch.stack([mags * angles.cos(), mags * angles.sin()], dim=1).float()
