"""LieRE (Ostmeier et al. 2024, arXiv 2406.10322): ``R(x) = exp(sum_i x_i A_i)`` with independent learned skew
generators per axis and head. The generators do not commute, so ``R(x)^T R(y)`` is not a function of
``y - x``: the baseline ComRoPE improves on, and the negative control of the relative-property tests.

``block_size = head_dim`` is LieRE's dense form (one ``head_dim x head_dim`` ``matrix_exp`` per token and
head: milliseconds each on a CPU, see docs/results.md, "Numbers behind implementation choices"). The default ``4`` is the block structure of the LieRE baseline in
ComRoPE's code (closed-form exponential, still non-commuting). With ``block_size = 2`` the blocks commute
and LieRE becomes RoPE-Mixed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from ..ops.block_rotation import BlockRotationTable
from ..ops.skew import exp_skew, matmul_safe_dtype, skew_part
from .base import Capabilities
from .learned_block_rotary import BlockRotaryPE
from .registry import register_pe


@register_pe("liere")
class LieRE(BlockRotaryPE):
    """LieRE: learned non-commuting rotations exp(sum_i x_i A_i) (baseline; not relative).

    Args:
        head_dim, num_heads, num_axes: as ComRoPE.
        block_size: channels per rotation block (``head_dim``: dense; default 4).
        init_std: entries of the generators' parameters ``P ~ N(0, init_std^2)`` (``A = P - P^T``).
        layout, num_prefix_tokens, prefix_at_centre, grid_size, perturbation, offset_std, seq_dim, seed:
            as :class:`~mmpos.encodings.comrope.ComRoPE`.
    Parameter ``P``: ``[num_axes, num_heads, head_dim // b, b, b]``.
    """

    description = "LieRE: learned non-commuting rotations exp(sum_i x_i A_i), a baseline that is not relative."

    example_options = dict(head_dim=16, num_heads=2, block_size=4, seed=0)
    capabilities = Capabilities(learnable=True, per_head_tables=True, reads_image_grid=True)  # relative iff b = 2

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        num_axes: int = 2,
        block_size: int = 4,
        init_std: float = 1.0,
        layout: str = "interleaved",
        num_prefix_tokens: int = 0,
        prefix_at_centre: bool = False,
        grid_size: Sequence[int] | None = None,
        perturbation: float = 0.0,
        offset_std: float = 0.0,
        seq_dim: int = -2,
        seed: int | None = None,
    ):
        super().__init__(
            head_dim,
            num_heads,
            num_axes,
            block_size,
            layout,
            num_prefix_tokens,
            seq_dim,
            grid_size,
            prefix_at_centre,
            perturbation,
            offset_std,
        )
        self.init_skew_parameter((num_axes, num_heads, self.num_blocks, block_size, block_size), init_std, seed)
        self.capabilities = replace(self.capabilities, relative=block_size == 2)  # 2x2 blocks commute

    def generators(self) -> torch.Tensor:
        """``A`` ``[num_heads, num_axes, num_blocks, b, b]`` (same layout as ComRoPE's)."""
        return skew_part(self.P).transpose(0, 1)

    def compute_table(self, coords: torch.Tensor, complex_dtype: torch.dtype) -> BlockRotationTable:
        """:class:`BlockRotationTable` ``[..., H, L, m, b, b]``."""
        coords, real_dtype, work_dtype = self.angle_inputs(coords, complex_dtype)
        with torch.autocast(coords.device.type, enabled=False):
            skew = skew_part(self.P.to(matmul_safe_dtype(work_dtype, coords.device)))  # no TF32 in matrix_exp
            generator = torch.einsum("...la,ahmij->...hlmij", coords, skew)  # [..., H, L, m, b, b]
            return BlockRotationTable(exp_skew(generator).to(real_dtype))

    def frequency_matrix(self) -> torch.Tensor:
        """``[H, A, head_dim // 2]``: each axis' generator's own rotation rates (the joint rotation of several
        axes does not factor into them, since the generators do not commute)."""
        with torch.no_grad():
            rates = torch.linalg.eigvals(skew_part(self.P.detach().double())).imag
            rates = rates.sort(dim=-1, descending=True).values[..., : self.block_size // 2]
            return rates.flatten(-2).transpose(0, 1)
