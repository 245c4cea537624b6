"""VRoPE position design (Liu et al., EMNLP 2025, arXiv 2502.11664): four diagonal index variants per token.

A frame of ``h x w`` tokens gets, for token (row i, col j), the variants

    v0 = i + j,  v1 = i + (w-1-j),  v2 = (h-1-i) + j,  v3 = (h-1-i) + (w-1-j)      (all in [0, K-1], K = h+w-1)

and frame ``t`` of a video starting at the running index ``c`` sits at ``c + t K + v``. Channel pair ``f`` reads
variant ``f % 4`` (:func:`pair_ids`), so every variant covers the whole spectrum. Text continues right after a
video at ``c + T K``; text tokens get ``c + l`` on every variant (plain 1D RoPE). The mean of the four variants
is the frame centre ``c + t K + (K-1)/2``, and ``v0 + v3 = v1 + v2`` so ``v3 = v1 + v2 - v0`` for every token:
three ids determine the fourth (:func:`compact_ids` / :func:`expand_ids`), which is how VRoPE rides in the
``(3, B, L)`` position ids of Qwen-VL models.

Ids are int64 ``[L, 4]``; convert with ``.float()`` (or :func:`as_coords`) for the encodings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch.types import Device

from .._validation import check_non_negative_int, check_positive_int

NUM_VARIANTS = 4
SEGMENT_KINDS = ("text", "shared_text", "image", "video")


def diagonal_variants(
    row: torch.Tensor, col: torch.Tensor, height: int | torch.Tensor, width: int | torch.Tensor
) -> torch.Tensor:
    """``[..., 4]`` variants ``(v0, v1, v2, v3)`` of tokens at ``row``, ``col`` of ``height x width`` frames.

    ``height`` and ``width`` may be ints or tensors broadcastable against ``row`` (one frame size per token).
    """
    flipped_row, flipped_col = height - 1 - row, width - 1 - col
    return torch.stack([row + col, row + flipped_col, flipped_row + col, flipped_row + flipped_col], dim=-1)


def video_block_ids(frames: int, height: int, width: int, start: int = 0, device: Device = None) -> torch.Tensor:
    """``[frames * height * width, 4]`` int64 ids of one video (frame-major, then row-major) at index ``start``."""
    for name, value in (("frames", frames), ("height", height), ("width", width)):
        check_positive_int(name, value)
    t, i, j = torch.meshgrid(*(torch.arange(n, device=device) for n in (frames, height, width)), indexing="ij")
    span = height + width - 1
    ids = diagonal_variants(i, j, height, width) + (start + t * span).unsqueeze(-1)
    return ids.reshape(-1, NUM_VARIANTS)


def video_grid_ids(frames: int, height: int, width: int, device: Device = None) -> torch.Tensor:
    """VRoPE coordinates ``[frames * height * width, 4]`` float32 of a video DiT's (t, row, col) patch grid."""
    return video_block_ids(frames, height, width, 0, device).float()


@dataclass
class VRoPEState:
    """Running index ``c`` of a VRoPE sequence; carry it across calls (one per sample) for decoding.

    ``ids(segments)`` lays segments out from ``index`` and advances it; ``next_text(n)`` gives decoding steps.
    """

    index: int = 0

    def ids(self, segments: Iterable[Sequence], device: Device = None) -> torch.Tensor:
        """``[L, 4]`` int64 ids of ``segments``; advances :attr:`index` (shared text does not advance it).

        Segments: ``("text", n)``, ``("shared_text", n)``, ``("image", h, w)``, ``("video", T, h, w)``, with
        ``h, w`` in language-model tokens (after any spatial merge).
        """
        pieces = [torch.zeros(0, NUM_VARIANTS, dtype=torch.int64, device=device)]
        for position, segment in enumerate(segments):
            kind, sizes = _parse_segment(segment, position)
            if kind in ("text", "shared_text"):
                length = sizes[0]
                pieces.append((self.index + torch.arange(length, device=device)).unsqueeze(-1).expand(-1, 4))
                if kind == "text":
                    self.index += length
            else:
                frames, height, width = (1,) + sizes if kind == "image" else sizes
                pieces.append(video_block_ids(frames, height, width, self.index, device))
                self.index += frames * (height + width - 1)
        return torch.cat(pieces)

    def next_text(self, length: int = 1, device: Device = None) -> torch.Tensor:
        """Ids ``[length, 4]`` of the next generated text tokens; advances :attr:`index`."""
        return self.ids([("text", length)], device)


def sequence_ids(
    segments: Iterable[Sequence], start: int = 0, device: Device = None
) -> tuple[torch.Tensor, VRoPEState]:
    """Ids ``[L, 4]`` of a whole sequence from index ``start``, and the state to continue decoding from."""
    state = VRoPEState(check_non_negative_int("start", start))
    return state.ids(segments, device), state


def pair_ids(ids: torch.Tensor, num_pairs: int) -> torch.Tensor:
    """Per-pair positions ``P[..., l, f] = ids[..., l, f % 4]``, ``[..., L, num_pairs]``."""
    check_positive_int("num_pairs", num_pairs)
    _check_variant_ids(ids)
    return ids[..., torch.arange(num_pairs, device=ids.device) % NUM_VARIANTS]


def compact_ids(ids: torch.Tensor) -> torch.Tensor:
    """Drop ``v3`` (``= v1 + v2 - v0``): ``[..., 4] -> [..., 3]``."""
    _check_variant_ids(ids)
    return ids[..., :3]


def expand_ids(compact: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`compact_ids`: ``[..., 3] -> [..., 4]`` with ``v3 = v1 + v2 - v0`` (exact for integers)."""
    if compact.shape[-1] != 3:
        raise ValueError(
            f"compact VRoPE ids must have 3 entries (v0, v1, v2) in the last dim, got {tuple(compact.shape)}"
        )
    fourth = compact[..., 1] + compact[..., 2] - compact[..., 0]
    return torch.cat([compact, fourth.unsqueeze(-1)], dim=-1)


def _check_variant_ids(ids: torch.Tensor) -> None:
    if not isinstance(ids, torch.Tensor) or ids.dim() < 1 or ids.shape[-1] != NUM_VARIANTS:
        raise ValueError(
            f"VRoPE ids must have shape [..., 4] (one id per diagonal variant), got {tuple(getattr(ids, 'shape', ()))}"
        )


def _parse_segment(segment: object, position: int) -> tuple[str, tuple[int, ...]]:
    if not isinstance(segment, (tuple, list)) or not segment or segment[0] not in SEGMENT_KINDS:
        raise ValueError(f"segments[{position}]={segment!r}: expected (kind, *sizes) with kind in {SEGMENT_KINDS}")
    kind, sizes = segment[0], tuple(segment[1:])
    expected = {"text": 1, "shared_text": 1, "image": 2, "video": 3}[kind]
    if len(sizes) != expected:
        raise ValueError(f"segments[{position}]={segment!r}: a {kind!r} segment takes {expected} size(s)")
    for size in sizes:
        check_positive_int(f"segments[{position}] size", size)
    return kind, sizes
