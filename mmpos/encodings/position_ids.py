"""transformers' position ids as mmpos coordinates, read from their shape against the q they encode.

transformers hands rotary embeddings ``position_ids`` ``[B, L]`` (1D RoPE: Llama, Qwen2) and, for the MRoPE
family, ``[3, B, L]`` (axes first: ``(t, h, w)``, from Qwen2-VL's ``get_rope_index``). mmpos coordinates put the
axis last: ``[B, L, 1]`` and ``[B, L, 3]``. The encodings that take these ids (``rope_1d``; ``mrope``,
``mrope_interleave``, ``mhrope``) call :func:`as_axis_last` in ``forward``, where q's batch and length tell the
two layouts apart.
"""

from __future__ import annotations

import torch


def as_axis_last(coords: torch.Tensor | None, num_axes: int, batch: int, length: int) -> torch.Tensor | None:
    """``coords`` in mmpos' axis-last layout; transformers' ``[B, L]`` (``num_axes == 1``) and ``[A, B, L]`` are
    moved, anything else is returned unchanged (``check_coords`` validates it).

    ``batch``, ``length``: q's batch size and tokens to encode. A shape that fits both layouts with different
    meanings (``A == B == L``) is refused: transpose it yourself (``position_ids.permute(1, 2, 0)``).
    """
    if not isinstance(coords, torch.Tensor):
        return coords
    if num_axes == 1 and coords.dim() == 2 and tuple(coords.shape) == (batch, length):
        return coords[..., None]  # [B, L] -> [B, L, 1] (also [B, 1] when decoding; [1, 1] means the same either way)
    if num_axes > 1 and coords.dim() == 3 and tuple(coords.shape) == (num_axes, batch, length):
        if tuple(coords.shape) == (batch, length, num_axes):
            raise ValueError(
                f"coords {tuple(coords.shape)} reads as transformers' [{num_axes}, B, L] position ids "
                f"and as [B, L, {num_axes}] coordinates; pass [B, L, {num_axes}] "
                "(position_ids.permute(1, 2, 0)) when B == L == the number of axes"
            )
        return coords.permute(1, 2, 0)
    return coords


class ReadsPositionIds:
    """Mixin of a :class:`~mmpos.encodings.rotary_base.RotaryPE`: ``forward`` also takes transformers' ids."""

    seq_dim: int
    num_prefix_tokens: int
    num_axes: int

    def coords_from_position_ids(self, coords: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
        length = q.shape[self.seq_dim] - self.num_prefix_tokens
        return as_axis_last(coords, self.num_axes, q.shape[0], length)
