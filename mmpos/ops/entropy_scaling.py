"""UltraImage's attention rule: sharpen each head's attention by a factor its attention entropy decides.

UltraImage (Zhao et al. 2025, arXiv 2512.04504) runs past the training size with the logits of every head of every
attention layer multiplied by a constant ``lambda >= 1``; the head's ``lambda`` comes from the entropy of its
attention at the first (noisiest) step at the target size. Re-derived from the authors' code (thu-ml/DiT-Extrapolation,
branches ``ultra-flux`` and ``ultra-qwenimage``: ``jintao/search.py`` measures, ``utils.get_continuous_decay`` maps,
``jintao/attn_qk_int8_per_block.py`` applies ``qk * decay_mask``):

* measure: the sequence (text and image tokens, the processor's order) padded with zero tokens to a multiple of
  ``block = 128``; ``P = softmax(q k^T / sqrt(D))`` over the padded keys; ``p[I, J] = sum_{i in I, j in J} P_ij / 128``
  for query block ``I`` and key block ``J``; ``H_I = -sum_J p log p``; the head's entropy ``H = mean_I H_I``;
* map (``func_type="power"``): ``z = (H - h_min) / (h_max - h_min)``, ``lambda = lambda_min + (lambda_max -
  lambda_min) (1 - z) ** gamma``: focused heads (low entropy) get ``lambda_max``, diffuse ones ``lambda_min``;
* apply: ``softmax(lambda * q k^T / sqrt(D)) v`` (the kernel's ``decay_mask`` is one value per batch and head).

mmpos clips ``z`` to ``[0, 1]`` (the code does not: below ``h_min`` the factor passes ``lambda_max``, above ``h_max``
it rises again for ``gamma = 2`` and is NaN for a fractional ``gamma``); inside ``[h_min, h_max]`` they agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EntropyScaling:
    """UltraImage's per-head logit factor from attention entropy (defaults: the authors' FLUX.1 config).

    Args:
        lambda_min, lambda_max: the factor for the most diffuse and the most focused heads (``>= 1`` sharpens).
        h_min, h_max: the entropy range (nats) mapped onto ``[lambda_max, lambda_min]``.
        gamma: the power law's exponent (1: linear in the normalised entropy).
        block: tokens per block of the entropy measurement (the authors' kernels: 128).
    """

    lambda_min: float = 1.1
    lambda_max: float = 1.3
    h_min: float = 0.44
    h_max: float = 6.0
    gamma: float = 2.0
    block: int = 128

    def __post_init__(self) -> None:
        if not (0 < self.lambda_min <= self.lambda_max):
            raise ValueError(f"need 0 < lambda_min <= lambda_max, got {self.lambda_min!r}, {self.lambda_max!r}")
        if not (0 <= self.h_min < self.h_max):
            raise ValueError(f"need 0 <= h_min < h_max (nats), got {self.h_min!r}, {self.h_max!r}")
        if not self.gamma > 0:
            raise ValueError(f"gamma must be positive, got {self.gamma!r}")
        if not (isinstance(self.block, int) and self.block >= 1):
            raise ValueError(f"block must be a positive int, got {self.block!r}")

    def entropy(self, query: torch.Tensor, key: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Each head's mean block-attention entropy, ``[B, H]`` (fp32 at least), from ``query, key [B, L, H, D]``.

        ``key_mask [B, L]`` (bool, True = attend): masked keys are left out of the softmax (the authors' code has
        no masks)."""
        work = torch.promote_types(query.dtype, torch.float32)
        q, k = (t.transpose(1, 2).to(work) for t in (query, key))  # [B, H, L, D]
        pad = (-q.shape[2]) % self.block
        q, k = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k))  # zero tokens, as the kernels pad
        keep = None
        if key_mask is not None:
            keep = torch.nn.functional.pad(key_mask.to(torch.bool), (0, pad), value=True)[:, None, None, :]
        blocks = q.shape[2] // self.block
        scale = q.shape[-1] ** -0.5
        total = torch.zeros(q.shape[:2], dtype=work, device=q.device)
        for start in range(0, q.shape[2], self.block):
            logits = q[:, :, start : start + self.block] @ k.transpose(-1, -2) * scale
            if keep is not None:
                logits = logits.masked_fill(~keep, -math.inf)
            mass = torch.softmax(logits, dim=-1).unflatten(-1, (blocks, self.block)).sum(dim=(-3, -1)) / self.block
            total += -torch.xlogy(mass, mass).sum(-1)
        return total / blocks

    def factor(self, entropy: torch.Tensor) -> torch.Tensor:
        """``lambda`` for each entropy (same shape)."""
        z = ((entropy - self.h_min) / (self.h_max - self.h_min)).clamp(0.0, 1.0)
        return self.lambda_min + (self.lambda_max - self.lambda_min) * (1.0 - z) ** self.gamma

    def scale_query(self, query: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        """``query [B, L, H, D]`` times ``factor [B, H]``: any attention of the result has logits ``lambda q k``."""
        return query * factor.to(query.dtype)[:, None, :, None]
