"""Per-token (or per-camera) 4x4 transforms of attention channels, the operator of GTA, PRoPE and UCPE.

The first ``num_channels`` channels of each head are read as ``num_channels / 4`` homogeneous 4-vectors
and each is multiplied by its token's matrix. Tokens are grouped: ``L = G * T`` tokens in ``G`` consecutive
groups of ``T`` (one group per camera for PRoPE, one per token for UCPE) share one matrix.
"""

from __future__ import annotations

import torch

from .rotation import compute_dtype


def check_block_matrices(name: str, matrices: torch.Tensor, x: torch.Tensor, seq_len: int) -> int:
    """Validate ``matrices [B or 1, G, 4, 4]`` against ``x [B, H, L, D]``; returns tokens per group."""
    if matrices.dim() != 4 or matrices.shape[-2:] != (4, 4):
        raise ValueError(f"{name} must be [B, G, 4, 4], got {tuple(matrices.shape)}")
    if matrices.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"{name} has batch {matrices.shape[0]}; x has batch {x.shape[0]}")
    groups = matrices.shape[1]
    if seq_len % groups:
        raise ValueError(
            f"{seq_len} tokens cannot be split into {groups} equal groups (cameras or tokens) of "
            f"{name}; expected L = groups * tokens_per_group"
        )
    return seq_len // groups


def transform_blocks(
    x: torch.Tensor, matrices: torch.Tensor, num_channels: int, transpose: bool = False
) -> torch.Tensor:
    """``x [B, H, L, D]`` with ``x[..., :num_channels]`` chunks of 4 replaced by ``M @ chunk`` (or ``M^T @
    chunk`` when ``transpose``); the other channels are copied. Returns a new tensor in ``x``'s dtype.

    The 4x4 products run in fp32 (fp64 for fp64 inputs, and for 16-bit inputs on the CPU) with autocast
    off; only the transformed channels are upcast.
    """
    if num_channels % 4 or num_channels > x.shape[-1]:
        raise ValueError(f"num_channels={num_channels} must be a multiple of 4 and <= head dim {x.shape[-1]}")
    per_group = check_block_matrices("matrices", matrices, x, x.shape[-2])
    real = compute_dtype(x.dtype, x.device)
    b, h, length, _ = x.shape
    with torch.autocast(x.device.type, enabled=False):
        chunks = x[..., :num_channels].to(real).reshape(b, h, length // per_group, per_group, -1, 4)
        m = matrices.to(x.device, real)
        equation = "bgji,bhgtnj->bhgtni" if transpose else "bgij,bhgtnj->bhgtni"
        out = torch.einsum(equation, m, chunks).reshape(b, h, length, num_channels)
    return torch.cat([out.to(x.dtype), x[..., num_channels:]], dim=-1)
