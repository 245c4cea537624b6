"""UltraViCo's attention rule: decay the attention of video tokens beyond the training window.

UltraViCo (Zhao et al. 2025, arXiv 2511.20123) multiplies by a constant ``alpha < 1`` the positive attention logits
of query/key pairs further apart than half the training window. Re-derived from the authors' Wan kernel
(thu-ml/DiT-Extrapolation, branch ``ultra-wan``, ``sageattn/attn_qk_int8_per_block.py``), written as dense attention
over a video sequence in frame-major token order (``frame * frame_tokens + row * cols + col``):

* logits ``s_ij = scale * q_i . (k_j - mean_j k)``: the kernel runs SageAttention, which centres the keys over the
  sequence (``smooth_k``); a per-row constant for softmax, but it decides which logits are positive;
* ``s_ij <- alpha * s_ij`` where ``|i - j| > W / 2`` (token distance, ``W = train_frames * frame_tokens``) and
  ``s_ij >= 0`` (the kernel keeps the logit where ``dist <= W / 2`` or ``s < 0``);
* queries of the first latent frame do not attend to keys of frames ``>= train_frames`` (the kernel's
  ``window3``; its comparisons ``m <= frame_tokens`` and ``n > train_frames * frame_tokens`` each take one token
  more or fewer than the frames they name: mmpos uses the frames);
* softmax over keys, times ``v``.

mmpos applies the rule only to sequences longer than the training window (``frames > train_frames``); at or below
it the caller runs its stock attention (the authors' kernel would decay pairs more than ``W / 2`` apart there too).

Joint attention (HunyuanVideo: the video tokens first, then text): only video/video pairs are decayed or masked, as
in the authors' HunyuanVideo kernel (branch ``ultra-hunyuan``: its ``mask3`` leaves the last 256 tokens, the text,
alone); a boolean ``mask`` (the model's padding) is applied as given. That kernel's extra factor on pairs 46-54,
96-104, ... frames apart (HunyuanVideo's repetition period) is not implemented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WindowDecay:
    """UltraViCo's rule for a video of ``frame_tokens`` tokens a frame.

    Args:
        train_frames: latent frames of the training length (Wan 2.1 at 81 frames: 21).
        alpha: the decay factor on positive logits beyond half the window, in ``(0, 1]`` (authors' default 0.9).
        isolate_first_frame: the first frame's queries do not see frames ``>= train_frames`` (the Wan kernel).
        center_keys: centre the keys over the sequence before the sign test (the kernel's SageAttention does).
    """

    train_frames: int
    alpha: float = 0.9
    isolate_first_frame: bool = True
    center_keys: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.train_frames, int) and self.train_frames >= 1):
            raise ValueError(f"train_frames must be a positive int (latent frames), got {self.train_frames!r}")
        if not (0.0 < float(self.alpha) <= 1.0):
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha!r}")

    def window(self, frame_tokens: int) -> int:
        """The training window in tokens."""
        return self.train_frames * frame_tokens

    def active(self, tokens: int, frame_tokens: int) -> bool:
        """Whether a video of ``tokens`` tokens is longer than the training window (else: stock attention)."""
        return tokens > self.window(frame_tokens)

    def logits(
        self,
        scores: torch.Tensor,
        rows: torch.Tensor,
        cols: torch.Tensor,
        frame_tokens: int,
        video_tokens: int | None = None,
    ) -> torch.Tensor:
        """The rule on logits ``scores [..., Lq, Lk]`` of query tokens ``rows [Lq]`` and key tokens ``cols [Lk]``; only
        pairs of the first ``video_tokens`` tokens (default: all) change."""
        distance = (rows[:, None] - cols[None, :]).abs()
        beyond = (2 * distance > self.window(frame_tokens)) & (scores >= 0)  # |i - j| > W / 2, in integers
        video = None if video_tokens is None else (rows[:, None] < video_tokens) & (cols[None, :] < video_tokens)
        scores = torch.where(beyond if video is None else beyond & video, scores * self.alpha, scores)
        if self.isolate_first_frame:
            hidden = (rows[:, None] < frame_tokens) & (cols[None, :] >= self.window(frame_tokens))
            scores = scores.masked_fill(hidden if video is None else hidden & video, -math.inf)
        return scores

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, frame_tokens: int, block: int = 1024,
        video_tokens: int | None = None, mask: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Dense attention with the rule; ``query, key, value [B, L, H, D]`` (diffusers' layout) -> ``[B, L, H, D]``.

        ``video_tokens``: the leading video tokens of a joint sequence (default: all); ``mask``: boolean, broadcast to
        ``[B, H, L, L]``, ``True`` where a pair attends (a query with none gets zeros). Logits and softmax in fp32 at
        least (the input's dtype if wider); queries in blocks of ``block`` rows: ``B * H * block * L`` logits.
        """
        video = key.shape[1] if video_tokens is None else video_tokens
        if query.shape[1] != key.shape[1] or video % frame_tokens or not 0 < video <= key.shape[1]:
            raise ValueError(
                f"the rule needs self-attention over whole frames: {query.shape[1]} queries, {key.shape[1]} keys, "
                f"{video} video tokens, frame_tokens={frame_tokens}"
            )
        if mask is not None and mask.dtype != torch.bool:
            raise ValueError(f"mask must be boolean (True: attend), got {mask.dtype}")
        work = torch.promote_types(query.dtype, torch.float32)
        q, k, v = (t.transpose(1, 2).to(work) for t in (query, key, value))  # [B, H, L, D]
        if self.center_keys:
            k = k - k.mean(dim=2, keepdim=True)
        scale = q.shape[-1] ** -0.5
        cols = torch.arange(k.shape[2], device=k.device)
        out = []
        for start in range(0, q.shape[2], block):
            rows = cols[start : start + block]
            scores = q[:, :, start : start + block] @ k.transpose(-1, -2) * scale
            scores = self.logits(scores, rows, cols, frame_tokens, video_tokens)
            if mask is not None:
                scores = scores.masked_fill(
                    ~(mask if mask.shape[-2] == 1 else mask[..., start : start + block, :]), -math.inf
                )
            weights = torch.softmax(scores, dim=-1)
            out.append((weights if mask is None else weights.nan_to_num(0.0)) @ v)
        return torch.cat(out, dim=2).transpose(1, 2).to(query.dtype)
