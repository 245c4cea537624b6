"""Qwen-Image 2.1 (``QwenImage21Transformer2DModel``): three axes ``(frame, row, col)``, theta 10000.

One joint sequence (text with condition images spliced in, the target image last). ``pos_embed``
(``QwenImage21Rope``) gives text tokens one position advancing on all three axes; each image block sits at the
frame position the text before it reached, on a row / col grid centred on zero (``-(h - h // 2) .. h // 2 - 1``),
and advances the position by ``max(h, w)``. Its complex64 table (float32 ladder ``1 / theta ** (2i / d)``, float32
phases) is precomputed on the CPU for positions ``0 .. 8191`` and ``-1024 .. -1`` and indexed by them; the seam
computes the same rows from the positions (:class:`~.codecs.PrecomputedRows`), so longer prompts and larger grids
just work. A schedule reads its scale from the image tokens only (the text positions run far past the images'),
over all image blocks; text tokens keep the training spectrum. The pipeline passes ``t = sigma``.
"""

from __future__ import annotations

import torch

from ..positions import identity_key
from . import register_family
from .base import Family
from .codecs import complex_pairs, precomputed_rows


def qwen21_ladder(dim: int, theta: float, dtype: torch.dtype, device=None) -> torch.Tensor:
    """``QwenImage21Rope.rope_params``' frequencies: ``1 / torch.pow(theta, arange(0, dim, 2).float() / dim)``."""
    return (1.0 / torch.pow(theta, torch.arange(0, dim, 2, device=device).to(torch.float32).div(dim))).to(dtype)


_STOCK = dict(freqs_dtype=torch.float32, stock_ladder=qwen21_ladder)


def qwen21_positions(img_shapes, is_image: list) -> tuple[list, list, list, list]:
    """``QwenImage21Rope``'s per-token ``(frame, row, col)`` lists of the joint sequence (``is_image``: per token),
    and the ``(frame, row, col)`` of the image tokens only."""
    frame, image_rows, image_cols, image_frames = [], [], [], []
    cursor = position = 0
    for _, height, width in img_shapes:
        start = is_image.index(True, cursor)
        frame.extend(range(position, position + start - cursor))
        position += start - cursor
        cursor = start + height * width
        frame.extend([position] * (height * width))
        image_frames.append(position)
        position += max(height, width)
        image_rows.extend(r for r in range(-(height - height // 2), height // 2) for _ in range(width))
        image_cols.extend(c for _ in range(height) for c in range(-(width - width // 2), width // 2))
    frame.extend(range(position, position + len(is_image) - cursor))
    return frame, image_rows, image_cols, image_frames


def _extent(values) -> float:
    return float(max(values) - min(values) + 1) if len(values) else 0.0


def qwen21_tables(seam, img_shapes, image_pad_mask: torch.Tensor, device) -> torch.Tensor:
    """``QwenImage21Rope(img_shapes, image_pad_mask, device)``: complex64 ``[S, sum(axes_dims) / 2]`` on ``device``."""
    if image_pad_mask.dim() != 1:
        raise ValueError(f"image_pad_mask has shape {tuple(image_pad_mask.shape)}; expected [S] (one joint sequence)")
    is_image = image_pad_mask.tolist()
    frame, image_rows, image_cols, image_frames = qwen21_positions(img_shapes, is_image)
    mask = image_pad_mask.to(device)
    pos = torch.tensor(frame, dtype=torch.long, device=device)[:, None].repeat(1, 3)
    pos[mask, 1] = torch.tensor(image_rows, dtype=torch.long, device=device)
    pos[mask, 2] = torch.tensor(image_cols, dtype=torch.long, device=device)
    rows = precomputed_rows(seam, **_STOCK)
    text = seam.training_spectra()
    image = seam.axis_spectra(extents=[_extent(image_frames), _extent(image_rows), _extent(image_cols)])
    table = complex_pairs(pos, text, seam.axes_dims, seam.theta, rows=rows, **_STOCK)
    if not all(a.is_stock and b.is_stock for a, b in zip(text, image)) and image is not text:
        image_table = complex_pairs(pos, image, seam.axes_dims, seam.theta, rows=rows, **_STOCK)
        table = torch.where(mask[:, None], image_table, table)
    return table


def qwen21_tables_key(seam, img_shapes, image_pad_mask, device):
    """What :func:`qwen21_tables` reads of the stock call: the shapes, the mask's values (the model builds a new mask
    every forward; the stock module reads its values too, one device sync) and the device."""
    if not isinstance(image_pad_mask, torch.Tensor):
        return identity_key(img_shapes), identity_key(image_pad_mask), device
    mask = image_pad_mask.detach().to("cpu", torch.uint8)
    return identity_key(img_shapes), tuple(mask.shape), mask.numpy().tobytes(), device


def qwen21_attention_modules(model) -> list:
    """``(name, attention module)`` of each block, in order (the edit seam installs its processors there)."""
    return [(f"transformer_blocks.{i}.attn", block.attn) for i, block in enumerate(model.transformer_blocks)]


QWEN_IMAGE21 = register_family(
    Family(
        name="qwenimage21",
        classes=("diffusers.models.transformers.transformer_qwenimage21:QwenImage21Transformer2DModel",),
        position_attr="pos_embed",
        axis_names=("frame", "row", "col"),  # rows and columns centred on each image
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.axes_dims_rope),
        native_theta=lambda model: float(model.pos_embed.theta),
        image_axes=(1, 2),
        tables=qwen21_tables,
        tables_key=qwen21_tables_key,
        attention_modules=qwen21_attention_modules,  # tier 1 still: set_pe keeps the stock processors
        timestep_per_sigma=1.0,  # QwenImage21Pipeline passes t / 1000 = sigma
        timestep_arg=("timestep", 2),
        pipelines=("QwenImage21Pipeline",),
        train_size=1024,
        pixels_per_token=16,
        notes="text advancing on all axes (scale from image tokens only); positions past the precomputed range computed",
    )
)
