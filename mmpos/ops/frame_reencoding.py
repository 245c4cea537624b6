"""FreeLOC's VRPR: video relative-position re-encoding, time positions regrouped by how far apart two frames are.

FreeLOC (Tian et al. 2026, arXiv 2603.25209) keeps every query/key pair's temporal relative position inside the
training range. Re-derived from the authors' Wan 2.1 code (github.com/Westlake-AGI-Lab/FreeLOC,
``wan/modules/model_freeloc.py``: ``WanSelfAttention.forward`` with ``rp_map_kwargs``, the masks of
``generate_VRPR_mask_mod``, ``vrpr_attention`` in ``wan/modules/attention.py``), as dense attention over a video in
frame-major token order. With query frame ``f``, key frame ``g``, windows ``w1 < w2`` and group sizes ``g1, g2``:

* near (``|f - g| < w1``): the stock positions ``(f, g)``;
* middle (``w1 <= |f - g| < w2``): ``(f // g1 + o1, g // g1)`` when the query is later, ``(f // g1, g // g1 + o1)``
  when earlier, ``o1 = floor(w1 - w1 / g1)``;
* far (``|f - g| >= w2``): ``(min(f // g2 + o2, m), g // g2)`` / ``(f // g2, min(g // g2 + o2, m))``,
  ``o2 = w2 - w2 // g2 - (w2 - w1) // g1``, ``m`` the clip (the authors' ``vrpr_clip_max``: ``train_frames - 1``);
* one softmax over all keys (the authors merge five attention calls by their log-sum-exps: the same thing).

Only the time coordinate changes; rows and columns keep theirs. q and k arrive rotated at the stock positions, so
each band rotates them further by the position change (``shift(x, frames)``: RoPE rotations compose).

Bands: by frame distance (``bands="frames"``, what the paper describes). ``bands="kernel"`` is the authors' code
to the token: bands by token distance ``d = i - j``, near ``|d| <= (w1 - 1) * frame_tokens`` (their flash-attention
window), middle from ``ceil128(w1 * frame_tokens)``, far from ``ceil128(w2 * frame_tokens)`` (their flex-attention
masks, rounded to its 128-token blocks); pairs between the near window and the middle band attend to nothing there
(about one frame of keys on each side), which the frame bands do not reproduce.

Not here: FreeLOC's tiered sparse attention (TSA) and its layer probing (the rule takes the layers to apply to).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

NEAR, MID_AFTER, MID_BEFORE, FAR_AFTER, FAR_BEFORE, NOWHERE = range(6)
Shift = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x [B, L, H, D], frames [L]) -> x rotated in time


@dataclass(frozen=True)
class FrameReencoding:
    """FreeLOC's VRPR for videos of ``frame_tokens`` tokens a frame (module docstring).

    Args:
        train_frames: latent frames of the training length (Wan 2.1 at 81 frames: 21); the positions are clipped to
            ``train_frames - 1``.
        near_frames / far_frames: ``w1`` and ``w2`` (the authors' Wan 2.1 4x setting: 10 and 14).
        near_group / far_group: ``g1`` and ``g2`` (2 and 8); ``far_group=None``: per video length (``far_group_at``).
        bands: ``"frames"`` or ``"kernel"`` (module docstring).
    """

    train_frames: int
    near_frames: int
    far_frames: int
    near_group: int = 2
    far_group: int | None = None
    bands: str = "frames"

    def __post_init__(self) -> None:
        for name in ("train_frames", "near_frames", "far_frames", "near_group", "far_group"):
            value = getattr(self, name)
            if name == "far_group" and value is None:
                continue
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{name} must be a positive int (latent frames), got {value!r}")
        if self.train_frames < 2:
            raise ValueError("train_frames must be at least 2 (positions are clipped to train_frames - 1), got 1")
        if not self.near_frames < self.far_frames:
            raise ValueError(f"near_frames ({self.near_frames}) must be below far_frames ({self.far_frames})")
        if self.bands not in ("frames", "kernel"):
            raise ValueError(f"bands must be 'frames' or 'kernel', got {self.bands!r}")

    @classmethod
    def scaled(cls, train_frames: int, **options: Any) -> "FrameReencoding":
        """The authors' Wan 2.1 setting at 4x (``w1, w2, g1 = 10, 14, 2`` for 21 frames) scaled to ``train_frames``
        (``w1, w2`` in proportion, at least 2 and 3), ``far_group`` per length; ``options`` override."""
        near = max(2, round(train_frames * 10 / 21))
        defaults = dict(near_frames=near, far_frames=max(near + 1, round(train_frames * 14 / 21)), near_group=2)
        return cls(train_frames, **{**defaults, **options})

    def far_group_at(self, frames: int) -> int:
        """``g2`` for a video of ``frames`` latent frames: ``far_group``, or else the authors' 8 scaled to the
        training length (at least 2), raised until the latest far key's group stays below the clip (so a later
        query keeps a larger position than every far key: the authors' 8 at 21 frames does up to 174 frames)."""
        if self.far_group is not None:
            return self.far_group
        clip = self.train_frames - 1
        return max(2, round(self.train_frames * 8 / 21), (frames - 1 - self.far_frames) // clip + 1)

    def active(self, tokens: int, frame_tokens: int) -> bool:
        """Whether a video of ``tokens`` tokens is longer than the training length (else: stock attention)."""
        return tokens > self.train_frames * frame_tokens

    def positions(self, frames: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Per band, the query and key time positions of frames ``frames [L]`` (integers)."""
        w1, w2, g1, clip = self.near_frames, self.far_frames, self.near_group, self.train_frames - 1
        g2 = self.far_group_at(len(frames) and int(frames.max()) + 1)
        mid = frames // g1 + math.floor(w1 - w1 / g1)
        far = torch.clamp(frames // g2 + (w2 - w2 // g2 - (w2 - w1) // g1), max=clip)
        return {
            NEAR: (frames, frames),
            MID_AFTER: (mid, frames // g1),
            MID_BEFORE: (frames // g1, mid),
            FAR_AFTER: (far, frames // g2),
            FAR_BEFORE: (frames // g2, far),
        }

    def band(self, rows: torch.Tensor, cols: torch.Tensor, frame_tokens: int) -> torch.Tensor:
        """The band of each pair of query tokens ``rows [Lq]`` and key tokens ``cols [Lk]`` -> ``[Lq, Lk]``."""
        w1, w2 = self.near_frames, self.far_frames
        if self.bands == "frames":
            distance = rows[:, None] // frame_tokens - cols[None, :] // frame_tokens
            near, mid, far = distance.abs() < w1, distance.abs() < w2, None
        else:
            distance = rows[:, None] - cols[None, :]
            blocks = lambda frames: math.ceil(frames * frame_tokens / 128) * 128  # noqa: E731
            near = distance.abs() <= (w1 - 1) * frame_tokens
            mid = (distance.abs() >= blocks(w1)) & (distance.abs() < blocks(w2))
            far = distance.abs() >= blocks(w2)
        out = torch.full(distance.shape, NOWHERE, dtype=torch.long, device=rows.device)
        later = distance > 0
        if far is None:
            far = ~mid
            mid = mid & ~near
        out[far] = torch.where(later, FAR_AFTER, FAR_BEFORE)[far]
        out[mid] = torch.where(later, MID_AFTER, MID_BEFORE)[mid]
        out[near] = NEAR
        return out

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, frame_tokens: int, shift: Shift,
        block: int = 1024,
    ) -> torch.Tensor:  # fmt: skip
        """Attention with the re-encoded time positions; ``query, key, value [B, L, H, D]`` rotated at the stock
        positions (diffusers' layout) -> ``[B, L, H, D]``. ``shift(x, frames [L])`` rotates ``x`` further in time by
        ``frames`` per token. Logits and softmax in fp32 at least; queries in blocks of ``block`` rows."""
        length = key.shape[1]
        if query.shape[1] != length or length % frame_tokens:
            raise ValueError(
                f"the rule needs self-attention over whole frames: {query.shape[1]} queries, {length} keys, "
                f"frame_tokens={frame_tokens}"
            )
        work = torch.promote_types(query.dtype, torch.float32)
        tokens = torch.arange(length, device=key.device)
        frames = tokens // frame_tokens
        moved = {
            band: (shift(query.to(work), (q_at - frames).to(work)), shift(key.to(work), (k_at - frames).to(work)))
            for band, (q_at, k_at) in self.positions(frames).items()
        }
        q = {band: pair[0].transpose(1, 2) for band, pair in moved.items()}  # [B, H, L, D]
        k = {band: pair[1].permute(0, 2, 3, 1) for band, pair in moved.items()}  # [B, H, D, L]
        v = value.to(work).transpose(1, 2)
        scale = query.shape[-1] ** -0.5
        out = []
        for start in range(0, length, block):
            rows = tokens[start : start + block]
            bands = self.band(rows, tokens, frame_tokens)
            scores = torch.full((*v.shape[:2], len(rows), length), -math.inf, dtype=work, device=v.device)
            for band in q:
                scores = torch.where(bands == band, q[band][:, :, start : start + block] @ k[band] * scale, scores)
            out.append(torch.softmax(scores, dim=-1) @ v)
        return torch.cat(out, dim=2).transpose(1, 2).to(query.dtype)
