"""CRPA's attention: one attention call per query stride, every token placed on that stride.

For the queries of one grid (pitch ``s``), q and every key are rotated at ``centres / s``
(:func:`~mmpos.coords.phase_aligned.phase_aligned_positions`), then attended by SDPA; the outputs are put back in
token order. With one grid only, this is one SDPA call on the stock positions. Any rotary encoding with
``table(coords, dtype, device)`` and ``rotate_qk(q, k, table)`` (mmpos' ``RotaryPE``, ``seq_dim=-3``) does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..coords.phase_aligned import MixedGrid, phase_aligned_positions


def phase_aligned_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, grid: MixedGrid, encoding: Any
) -> torch.Tensor:
    """``query, key, value [B, L, H, D]`` (unrotated; ``L`` tokens of ``grid``) -> ``[B, L, H, D]``."""
    length = len(grid.strides)
    if query.shape[1] != length or key.shape[1] != length or value.shape[1] != length:
        raise ValueError(
            f"query, key and value must hold the grid's {length} tokens on dim 1, got {query.shape[1]}, "
            f"{key.shape[1]}, {value.shape[1]}"
        )
    out = torch.empty_like(query)
    for stride in grid.scales():
        rows = (grid.strides == stride).nonzero().squeeze(1).to(query.device)
        positions = phase_aligned_positions(
            grid, stride, torch.float64 if query.dtype == torch.float64 else torch.float32
        )
        table = encoding.table(positions, query.dtype, query.device)
        q, k = encoding.rotate_qk(query, key, table)
        attended = F.scaled_dot_product_attention(
            q[:, rows].transpose(1, 2), k.transpose(1, 2), value.transpose(1, 2)
        ).transpose(1, 2)
        out[:, rows] = attended
    return out
