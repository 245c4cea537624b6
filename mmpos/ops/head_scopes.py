"""HRDiT's HAP: head-adaptive attention pruning, each head attending within its own band of image blocks.

HAP (Head-adaptive Attention Pruning, HRDiT, arXiv 2608.07003) gives every head of a layer a scope ``(alpha, beta)``
measured once on the model, and prunes its attention outside it. Re-derived from the authors' code
(github.com/zylwithxy/HRDiT, ``hrdit/hap.py``: a FlexAttention ``mask_mod``), on a joint sequence of ``text_tokens``
text tokens followed by the image tokens, in blocks of ``block = 64`` image tokens:

* head ``h``'s band in blocks: ``width = max(2 * int(alpha // block + beta * (L // block)) - 1, 1)`` (``L``: the
  whole sequence, text included, as their ``seq_len``), half width ``(width - 1) // 2``;
* query ``q`` sees key ``k`` when ``q`` or ``k`` is a text token, or their image blocks are at most the half width
  apart, or ``k``'s image block is an anchor (``block index % anchor_stride == 0``; with anchors off the authors'
  stride is ``2 ** 30``, so image block 0 stays visible: kept).

:meth:`HeadScopes.attend` computes that masked attention without the pruned blocks (each query block against the
text, its band and the anchors outside the band): the same softmax over the same keys as the dense masked attention,
at a cost that grows with ``L`` times the band instead of ``L ** 2``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

ANCHORS_OFF = 1 << 30  # the authors' stride when anchors are off


@dataclass(frozen=True)
class HeadScopes:
    """One layer's scopes: ``alphas``, ``betas`` one per head (the authors' FLUX.1 plan: alpha 2048, beta 0)."""

    alphas: tuple[float, ...]
    betas: tuple[float, ...]
    text_tokens: int = 512
    block: int = 64
    anchor_stride: int = 0

    def __post_init__(self) -> None:
        if len(self.alphas) != len(self.betas) or not self.alphas:
            raise ValueError(f"alphas and betas need one value per head, got {len(self.alphas)} and {len(self.betas)}")
        if self.text_tokens < 0 or self.block < 1 or self.anchor_stride < 0:
            raise ValueError(
                f"need text_tokens >= 0, block >= 1, anchor_stride >= 0; got {self.text_tokens}, {self.block}, "
                f"{self.anchor_stride}"
            )

    def half_widths(self, length: int) -> list[int]:
        """Per head, the band's half width in image blocks for a sequence of ``length`` tokens."""
        blocks = length // self.block
        widths = [max(2 * int(a // self.block + b * blocks) - 1, 1) for a, b in zip(self.alphas, self.betas)]
        return [(w - 1) // 2 for w in widths]

    def stride(self) -> int:
        return self.anchor_stride if self.anchor_stride > 0 else ANCHORS_OFF

    def mask(self, length: int, device: torch.types.Device = None) -> torch.Tensor:
        """The dense mask ``[H, L, L]`` (True: attended)."""
        index = torch.arange(length, device=device)
        text = index < self.text_tokens
        blocks = torch.div(index - self.text_tokens, self.block, rounding_mode="floor")
        half = torch.tensor(self.half_widths(length), device=device)[:, None, None]
        band = (blocks[:, None] - blocks[None, :]).abs()[None] <= half
        anchor = (blocks % self.stride() == 0)[None, None, :]
        return text[None, :, None] | text[None, None, :] | band | anchor

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None = None
    ) -> torch.Tensor:
        """``query, key, value [B, L, H, D]`` -> ``[B, L, H, D]``: the masked attention, pruned blocks skipped.
        Text queries attend densely; image queries in blocks, heads of one half width together."""
        length, heads = query.shape[1], query.shape[2]
        if len(self.alphas) != heads:
            raise ValueError(f"the scopes hold {len(self.alphas)} heads, the attention runs {heads}")
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, H, L, D]
        out = torch.empty_like(q)
        text = self.text_tokens
        out[:, :, :text] = F.scaled_dot_product_attention(q[:, :, :text], k, v, scale=scale)
        halves = self.half_widths(length)
        for half in sorted(set(halves)):
            group = [h for h in range(heads) if halves[h] == half]
            rows = self._image_rows(q[:, group], k[:, group], v[:, group], half, scale)
            out[:, group, text:] = rows
        return out.transpose(1, 2)

    def _image_rows(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, half: int, scale: float | None
    ) -> torch.Tensor:
        """Image queries of heads sharing ``half``: per query block, keys = text, the band, anchors off the band."""
        batch, heads, length, dim = q.shape
        text, block = self.text_tokens, self.block
        image = length - text
        blocks = -(-image // block)
        pad = blocks * block - image
        qi = F.pad(q[:, :, text:], (0, 0, 0, pad)).unflatten(2, (blocks, block))  # [B, H, nb, blk, D]
        ki, vi = (F.pad(t[:, :, text:], (0, 0, 0, pad)).unflatten(2, (blocks, block)) for t in (k, v))
        real = F.pad(torch.ones(image, dtype=torch.bool, device=q.device), (0, pad)).unflatten(0, (blocks, block))
        offsets = torch.arange(-half, half + 1, device=q.device)
        neighbour = torch.arange(blocks, device=q.device)[:, None] + offsets  # [nb, window]
        inside = (neighbour >= 0) & (neighbour < blocks)
        neighbour = neighbour.clamp(0, blocks - 1)
        band_k, band_v = ki[:, :, neighbour], vi[:, :, neighbour]  # [B, H, nb, window, blk, D]
        band_ok = inside[:, :, None] & real[neighbour]  # [nb, window, blk]
        anchors = torch.arange(0, blocks, self.stride(), device=q.device)
        far = (anchors[None, :] - torch.arange(blocks, device=q.device)[:, None]).abs() > half  # [nb, A]
        anchor_k, anchor_v = ki[:, :, anchors], vi[:, :, anchors]  # [B, H, A, blk, D]
        anchor_ok = far[:, :, None] & real[anchors][None]  # [nb, A, blk]
        keys = torch.cat(
            [
                k[:, :, None, :text].expand(-1, -1, blocks, -1, -1),
                band_k.flatten(3, 4),
                anchor_k.flatten(2, 3)[:, :, None].expand(-1, -1, blocks, -1, -1),
            ],
            dim=3,
        )
        values = torch.cat(
            [
                v[:, :, None, :text].expand(-1, -1, blocks, -1, -1),
                band_v.flatten(3, 4),
                anchor_v.flatten(2, 3)[:, :, None].expand(-1, -1, blocks, -1, -1),
            ],
            dim=3,
        )
        allowed = torch.cat(
            [
                torch.ones(blocks, text, dtype=torch.bool, device=q.device),
                band_ok.flatten(1, 2),
                anchor_ok.flatten(1, 2),
            ],
            dim=1,
        )  # [nb, keys]
        rows = F.scaled_dot_product_attention(qi, keys, values, attn_mask=allowed[:, None, :], scale=scale)
        return rows.flatten(2, 3)[:, :, :image]
