"""Lumina-Image 2.0 (``Lumina2Transformer2DModel``): three axes ``(index, row, col)``, theta 10000.

Its ``rope_embedder`` (``Lumina2RotaryPosEmbed``) also patchifies: ``(hidden_states [B, C, H, W],
attention_mask [B, L_txt])`` -> ``(patches, caption tables, image tables, joint tables, caption lengths, sequence
lengths)``. Caption token ``j`` gets ids ``(j, 0, 0)``, image tokens ``(caption length, row, col)``, padding
``(0, 0, 0)``; the tables are complex128 (float64 ladder and phases, float32 on machines with MPS), precomputed on
the CPU up to ``axes_lens`` (512 tokens per image axis by default) and gathered by the ids. The seam computes the
same rows from the positions (:class:`~.codecs.PrecomputedRows`), so larger grids just work. A schedule reads its
scale from the image grid; captions and padding keep the training spectrum. The pipeline passes ``t = 1 - sigma``.
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family
from .codecs import complex_pairs, precomputed_rows


def _stock_dtype() -> dict:
    """``Lumina2RotaryPosEmbed._precompute_freqs_cis``' dtype."""
    return dict(freqs_dtype=torch.float32 if torch.backends.mps.is_available() else torch.float64)


def lumina2_position_ids(caption_lengths, rows: int, cols: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B, L, 3] int32, is_image [B, L] bool)`` of the joint sequences (captions, then the image grid)."""
    length = max(caption_lengths) + rows * cols
    ids = torch.zeros(len(caption_lengths), length, 3, dtype=torch.int32, device=device)
    is_image = torch.zeros(len(caption_lengths), length, dtype=torch.bool, device=device)
    grid = torch.cartesian_prod(
        torch.arange(rows, dtype=torch.int32, device=device), torch.arange(cols, dtype=torch.int32, device=device)
    ).reshape(-1, 2)
    for sample, caption in enumerate(caption_lengths):
        ids[sample, :caption, 0] = torch.arange(caption, dtype=torch.int32, device=device)
        ids[sample, caption : caption + rows * cols, 0] = caption
        ids[sample, caption : caption + rows * cols, 1:] = grid
        is_image[sample, caption : caption + rows * cols] = True
    return ids, is_image


def lumina2_tables(seam, hidden_states: torch.Tensor, attention_mask: torch.Tensor):
    """``Lumina2RotaryPosEmbed.forward``: the patches and the tables, in its format and dtypes."""
    if hidden_states.dim() != 4 or attention_mask.dim() != 2:
        raise ValueError(
            f"hidden_states {tuple(hidden_states.shape)} and attention_mask {tuple(attention_mask.shape)}"
            "; expected [B, C, H, W] latents and a [B, L] caption mask"
        )
    batch, channels, height, width = hidden_states.shape
    p = seam.stock[0].patch_size
    rows, cols = height // p, width // p
    device = hidden_states.device
    captions = attention_mask.sum(dim=1).tolist()
    ids, is_image = lumina2_position_ids(captions, rows, cols, device)
    stock = _stock_dtype()
    flat, table_rows = ids.reshape(-1, 3), precomputed_rows(seam, **stock)
    text = seam.training_spectra()
    image = seam.axis_spectra(extents=[max(captions) - min(captions) + 1, rows, cols])
    freqs = complex_pairs(flat, text, seam.axes_dims, seam.theta, rows=table_rows, **stock).view(*ids.shape[:2], -1)
    if not all(a.is_stock and b.is_stock for a, b in zip(text, image)) and image is not text:
        image_freqs = complex_pairs(flat, image, seam.axes_dims, seam.theta, rows=table_rows, **stock)
        freqs = torch.where(is_image[..., None], image_freqs.view_as(freqs), freqs)
    caption_freqs = freqs.new_zeros(batch, attention_mask.shape[1], freqs.shape[-1])
    image_tokens = freqs.new_zeros(batch, rows * cols, freqs.shape[-1])
    for sample, caption in enumerate(captions):
        caption_freqs[sample, :caption] = freqs[sample, :caption]
        image_tokens[sample] = freqs[sample, caption : caption + rows * cols]
    patches = hidden_states.view(batch, channels, rows, p, cols, p).permute(0, 2, 4, 3, 5, 1).flatten(3).flatten(1, 2)
    return patches, caption_freqs, image_tokens, freqs, captions, [c + rows * cols for c in captions]


LUMINA2 = register_family(
    Family(
        name="lumina2",
        classes=("diffusers.models.transformers.transformer_lumina2:Lumina2Transformer2DModel",),
        position_attr="rope_embedder",
        axis_names=("index", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.axes_dim_rope),
        native_theta=lambda model: float(model.rope_embedder.theta),
        image_axes=(1, 2),
        tables=lumina2_tables,
        timestep_per_sigma=-1.0,  # Lumina2Pipeline passes 1 - t / 1000 = 1 - sigma
        timestep_at_zero_sigma=1.0,
        timestep_arg=("timestep", 1),
        pipelines=("Lumina2Pipeline",),
        train_size=1024,
        pixels_per_token=16,
        notes="the seam also patchifies; complex128 tables; positions past axes_lens computed; t = 1 - sigma",
    )
)
