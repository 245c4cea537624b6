"""HRDiT's SPA attention: the attention outputs averaged over several rotary tables (one per bundle grid).

``mean_n softmax(s * R_n(q) R_n(k)^T) v`` (the paper's average of attention maps; equal to the average of outputs,
since ``v`` is shared), one SDPA call per table. The tables come from
:func:`~mmpos.coords.bundles.bundle_variants` through any mmpos rotary encoding.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F


def averaged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tables: Sequence[Any],
    encoding: Any,
    scale: float | None = None,
) -> torch.Tensor:
    """``query, key, value [B, L, H, D]`` (unrotated) -> ``[B, L, H, D]``; ``encoding.rotate_qk(q, k, table)`` per
    table (``seq_dim=-3``); ``scale``: SDPA's (default ``1 / sqrt(D)``)."""
    if not tables:
        raise ValueError("tables must hold at least one rotary table")
    total = None
    for table in tables:
        q, k = encoding.rotate_qk(query, key, table)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), value.transpose(1, 2), scale=scale
        ).transpose(1, 2)
        total = out if total is None else total + out
    assert total is not None
    return total / len(tables)
