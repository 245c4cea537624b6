"""Block-diagonal rotations: each token's ``b x b`` block rotations applied to ``b`` contiguous channels.

The operator of ComRoPE and LieRE with blocks larger than 2. Only the ``[..., L, m, b, b]`` blocks are
stored (``m = rotary_dim / b``), never a dense ``d x d`` matrix per token. Rotations shared by the batch
(one table for all samples) are applied as one batched matrix product with the batch folded into the
columns, so the table is never copied per sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validation import sequence_length_error
from .rotation import compute_dtype


@dataclass(eq=False)
class BlockRotationTable:
    """``matrices``: ``[..., L, m, b, b]`` real; leading dims broadcast against ``[B, H]``."""

    matrices: torch.Tensor

    @property
    def block_size(self) -> int:
        return self.matrices.shape[-1]

    @property
    def num_blocks(self) -> int:
        return self.matrices.shape[-3]

    @property
    def length(self) -> int:
        return self.matrices.shape[-4]

    @property
    def rotary_dim(self) -> int:
        return self.num_blocks * self.block_size

    def transpose(self) -> "BlockRotationTable":
        """The inverse rotation."""
        return BlockRotationTable(self.matrices.transpose(-1, -2))


def apply_block_rotation(
    x: torch.Tensor, table: BlockRotationTable, *, seq_dim: int = -2, num_prefix_tokens: int = 0
) -> torch.Tensor:
    """Rotate each block of ``b`` channels of ``x`` by its token's matrix; returns a new tensor.

    Args:
        x: ``[..., L, D]`` (``seq_dim=-2``) or ``[B, L, H, D]`` (``seq_dim=-3``).
        table: ``[..., L - num_prefix_tokens, m, b, b]``; channels ``m * b ..`` and the prefix tokens pass
            through unchanged.
    Arithmetic runs in :func:`~mmpos.ops.rotation.compute_dtype` (fp64 for 16-bit inputs on the CPU, fp32
    on GPUs) and is rounded once to ``x.dtype``. Differentiable in ``x`` and in the table.
    """
    xv = _check(x, table, seq_dim, num_prefix_tokens)
    n, rot = num_prefix_tokens, table.rotary_dim
    real = compute_dtype(x.dtype, x.device)
    blocks = xv[..., n:, :rot].unflatten(-1, (table.num_blocks, table.block_size))  # [*lead, L, m, b]
    rotated = _rotate_blocks(blocks, table.matrices.to(x.device, real), real).flatten(-2).to(x.dtype)
    pieces = [rotated] if rot == x.shape[-1] else [rotated, xv[..., n:, rot:]]
    out = torch.cat(pieces, dim=-1) if len(pieces) > 1 else rotated
    if n:
        out = torch.cat([xv[..., :n, :], out], dim=-2)
    return out.movedim(-2, seq_dim)


def _rotate_blocks(blocks: torch.Tensor, matrices: torch.Tensor, real: torch.dtype) -> torch.Tensor:
    """``blocks [*lead, L, m, b]`` times ``matrices [*lead', L, m, b, b]`` (``lead'`` broadcasts to ``lead``)."""
    extra = blocks.dim() - (matrices.dim() - 1)
    lead_m = (1,) * extra + tuple(matrices.shape[:-4])
    lead_x = tuple(blocks.shape[:-3])
    shared = [i for i, (a, b) in enumerate(zip(lead_m, lead_x)) if a == 1 and b != 1]
    if not shared:  # one matrix per (sample, head): a plain batched matrix-vector product
        return (matrices @ blocks.to(real).unsqueeze(-1)).squeeze(-1)
    # Fold the dims the table is shared over into the columns of one matrix product: [.., b, b] @ [.., b, N].
    cols = blocks.to(real).movedim(shared, list(range(-len(shared), 0)))  # [*kept, L, m, b, *shared]
    shared_shape = cols.shape[cols.dim() - len(shared) :]
    cols = cols.flatten(-len(shared)) if len(shared) > 1 else cols
    kept_m = matrices.reshape(tuple(s for i, s in enumerate(lead_m) if i not in shared) + matrices.shape[-4:])
    out = (kept_m @ cols).unflatten(-1, shared_shape) if len(shared) > 1 else kept_m @ cols
    return out.movedim(list(range(-len(shared), 0)), shared)


def _check(x: torch.Tensor, table: object, seq_dim: int, num_prefix_tokens: int) -> torch.Tensor:
    if not isinstance(table, BlockRotationTable):
        raise TypeError(f"table must be a BlockRotationTable, got {type(table).__name__}")
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError(f"x must be a tensor with a sequence and a channel dim, got shape {getattr(x, 'shape', x)}")
    if seq_dim not in (-2, -3):
        raise ValueError(f"seq_dim must be -2 ([..., L, D]) or -3 ([B, L, H, D]), got {seq_dim}")
    if table.rotary_dim > x.shape[-1]:
        raise ValueError(f"the table rotates {table.rotary_dim} channels but x has only {x.shape[-1]} (head dim)")
    if num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be >= 0, got {num_prefix_tokens}")
    length = x.shape[seq_dim] - num_prefix_tokens
    if table.length != length:
        raise sequence_length_error(table.length, tuple(x.shape), seq_dim, num_prefix_tokens)
    xv = x.movedim(seq_dim, -2)
    lead_table, lead_x = tuple(table.matrices.shape[:-4]), tuple(xv.shape[:-2])
    fits = len(lead_table) <= len(lead_x) and all(t in (1, s) for t, s in zip(reversed(lead_table), reversed(lead_x)))
    if not fits:
        raise ValueError(
            f"table leading dims {lead_table} (batch/heads) must broadcast to x's {lead_x}; "
            "e.g. a per-head table needs x with the same number of heads"
        )
    return xv
