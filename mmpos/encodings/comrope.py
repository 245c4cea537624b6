"""ComRoPE (Yu et al., CVPR 2025, arXiv 2506.03737): rotary encoding with trainable commuting angle matrices.

``R(x) = exp(sum_i x_i A_i)`` with block-diagonal skew ``A_i``. Every block ``j`` of a head is driven by one
learned skew matrix ``S_j = P_j - P_j^T`` and a scalar phase ``t_j(x) = sum_i C[i, j] x_i``, so
``R_j(x) = exp(t_j(x) S_j)``: the generators of one block are multiples of ``S_j`` and commute, which is
exactly what makes ``R(x)^T R(y) = R(y - x)`` (the relative property).

- ``comrope_ap`` (axis partition): ``C[i, j] = 1`` iff ``j % num_axes == i`` (block ``j`` reads axis
  ``j mod N``, interleaved across axes).
- ``comrope_ld`` (linearly dependent): ``C[i, j] = theta[i, j]`` learned, shared by the heads.

With ``b = 2``, ``S_j = s_j J`` and ``R_j`` is the planar rotation by ``t_j s_j``: ComRoPE-AP is axial RoPE
with learned per-head frequencies and ComRoPE-LD is RoPE-Mixed with ``freqs[h, i, j] = s[h, j] theta[i, j]``;
both use the RoPE table and kernel. ``b = 4`` has a closed-form exponential; other sizes use
``torch.linalg.matrix_exp`` on the ``[..., L, m, b, b]`` blocks (never a dense ``d x d`` per token).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..ops.block_rotation import BlockRotationTable
from ..ops.phasors import unit_phasor_table
from ..ops.skew import exp_scaled_skew, exp_scaled_skew_4_terms, matmul_safe_dtype, skew_part
from .base import Capabilities
from .learned_block_rotary import BlockRotaryPE
from .registry import register_pe
from .rotary_base import Table


class ComRoPE(BlockRotaryPE):
    """Args:
        head_dim: channels per head; ``block_size`` must divide it.
        num_heads: heads (each has its own ``P``).
        num_axes: coordinate axes (2: row, col; 3: frame, row, col).
        block_size: ``b``, channels per rotation block (2 in the reference's default).
        init_std: ``P ~ N(0, init_std^2)`` (reference: 1.0, sized for normalised coordinates in (0, 1)).
        layout: ``"interleaved"`` (blocks are contiguous channels) or, for ``b = 2`` only, ``"half"``.
        num_prefix_tokens: leading tokens (cls, registers); unrotated unless ``prefix_at_centre``.
        prefix_at_centre: rotate the prefix tokens at the grid centre (the reference's cls at (0.5, 0.5)).
        grid_size: cells per axis; enables ``coords=None`` (normalised grid) and the perturbation.
        perturbation, offset_std: training-time jitter (patches) and global offset std of the coordinates.
        seq_dim: ``-2`` for ``[B, H, L, D]``, ``-3`` for ``[B, L, H, D]``.
        seed: seed of the initial parameters (``None``: the global generator).
    Parameters: ``P`` ``[num_heads, head_dim // b, b, b]`` (only ``P - P^T`` matters); LD adds ``theta``
    ``[num_axes, head_dim // b]``.
    """

    capabilities = Capabilities(relative=True, learnable=True, per_head_tables=True, reads_image_grid=True)

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        num_axes: int = 2,
        block_size: int = 2,
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
        shape = (num_heads, self.num_blocks, block_size, block_size)
        self.init_axis_coefficients(self.init_skew_parameter(shape, init_std, seed))

    def init_axis_coefficients(self, generator: torch.Generator | None) -> None:
        """Create the buffer or parameter behind :meth:`axis_coefficients`."""
        raise NotImplementedError

    def axis_coefficients(self) -> torch.Tensor:
        """``C`` ``[num_axes, num_blocks]``: how much each axis drives each block's phase."""
        raise NotImplementedError

    def generators(self) -> torch.Tensor:
        """``A`` ``[num_heads, num_axes, num_blocks, b, b]``: the block-diagonal skew angle matrices."""
        return self.axis_coefficients()[None, :, :, None, None] * skew_part(self.P)[:, None]

    def block_phases(self, coords: torch.Tensor) -> torch.Tensor:
        """``t`` ``[..., L, num_blocks]`` for coords ``[..., L, A]`` (in the coords' dtype)."""
        return coords @ self.axis_coefficients().to(coords)

    def compute_table(self, coords: torch.Tensor, complex_dtype: torch.dtype) -> Table:
        """A :class:`RotaryTable` (``b = 2``) or :class:`BlockRotationTable` ``[..., H, L, m, b, b]``."""
        coords, real_dtype, work_dtype = self.angle_inputs(coords, complex_dtype)
        with torch.autocast(coords.device.type, enabled=False):
            return self._table(coords, real_dtype, work_dtype)

    def _table(self, coords: torch.Tensor, real_dtype: torch.dtype, work_dtype: torch.dtype) -> Table:
        """The table of ``coords [..., L, A]`` (already in ``work_dtype``), stored in ``real_dtype``."""
        t = self.block_phases(coords).unsqueeze(-3)  # [..., 1, L, m]: shared by the heads
        skew = skew_part(self.P.to(work_dtype))[:, None]  # [H, 1, m, b, b]
        if self.block_size == 2:
            return unit_phasor_table(t * skew[..., 1, 0], _complex(real_dtype))
        exact = matmul_safe_dtype(work_dtype, coords.device)  # the products below multiply matrices
        t, skew = t.to(exact), skew.to(exact)
        if self.block_size == 4:  # closed form: per token 4 coefficients of 4 fixed matrices per head and block
            coefficients, basis = exp_scaled_skew_4_terms(t, skew)  # [..., H, L, m, 4], [H, 1, m, 4, 4, 4]
            matrices = torch.einsum("...hlmk,hmkij->...hlmij", coefficients, basis[:, 0])
            return BlockRotationTable(matrices.to(real_dtype))
        return BlockRotationTable(exp_scaled_skew(t, skew, real_dtype))

    def frequency_matrix(self) -> torch.Tensor:
        """``[H, A, head_dim // 2]``: per block, its rotation frequencies (eigenvalues ``i w`` of ``S_j``) times
        ``C[i, j]``; exact for ``b = 2`` (the RoPE frequencies), the spectrum in the block's own basis for
        larger blocks."""
        with torch.no_grad():
            skew = skew_part(self.P.detach().double())
            if self.block_size == 2:
                rates = skew[..., 1, 0, None]  # [H, m, 1]
            else:
                rates = torch.linalg.eigvals(skew).imag.sort(dim=-1, descending=True).values
                rates = rates[..., : self.block_size // 2]  # [H, m, b // 2], the positive ones
            coeff = self.axis_coefficients().detach().double()
            return (coeff[None, :, :, None] * rates[:, None]).flatten(-2)


@register_pe("comrope_ap")
class ComRoPEAP(ComRoPE):
    """ComRoPE-AP: block ``j`` of every head rotates with axis ``j mod num_axes`` by a learned ``exp(x S_j)``.

    Options as :class:`ComRoPE`; ``head_dim / num_axes`` must be a multiple of ``block_size``.
    """

    description = "ComRoPE-AP: each block of a head rotates with one axis by a learned commuting generator."

    example_options = dict(head_dim=16, num_heads=2, block_size=2, seed=0)
    axis_of_block: torch.Tensor  # buffers (init_axis_coefficients)
    axis_mask: torch.Tensor

    def init_axis_coefficients(self, generator: torch.Generator | None) -> None:
        if self.head_dim % (self.num_axes * self.block_size):
            raise ValueError(
                f"comrope_ap needs head_dim / num_axes to be a multiple of block_size: head_dim="
                f"{self.head_dim}, num_axes={self.num_axes}, block_size={self.block_size}"
            )
        axis_of_block = torch.arange(self.num_blocks) % self.num_axes
        mask = (axis_of_block[None, :] == torch.arange(self.num_axes)[:, None]).to(torch.float32)
        self.register_buffer("axis_of_block", axis_of_block, persistent=False)
        self.register_buffer("axis_mask", mask, persistent=False)

    def axis_coefficients(self) -> torch.Tensor:
        return self.axis_mask

    def block_phases(self, coords: torch.Tensor) -> torch.Tensor:
        return coords[..., self.axis_of_block.to(coords.device)]  # t_j = x_{j mod N}, exactly


@register_pe("comrope_ld")
class ComRoPELD(ComRoPE):
    """ComRoPE-LD: block ``j`` rotates by ``exp((sum_i theta[i, j] x_i) S_j)``, ``theta`` learned (per axis and
    block, shared by the heads; initialised ``N(0, 1)`` as in the reference). Options as :class:`ComRoPE`."""

    description = "ComRoPE-LD: each block rotates by a learned mix of the axes through commuting generators."

    example_options = dict(head_dim=16, num_heads=2, block_size=4, seed=0)

    def init_axis_coefficients(self, generator: torch.Generator | None) -> None:
        self.theta = nn.Parameter(torch.randn(self.num_axes, self.num_blocks, generator=generator))

    def axis_coefficients(self) -> torch.Tensor:
        return self.theta


def _complex(real_dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if real_dtype == torch.float64 else torch.complex64
