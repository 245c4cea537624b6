"""Cosmos 3 Omni (``Cosmos3OmniTransformer``, ``Cosmos3OmniPipeline`` and its modular pipelines): ``rotary_emb``
(``Cosmos3VLTextRotaryEmbedding``) is Qwen3-VL's interleaved multimodal RoPE over the packed sequence's
``position_ids [3, N]`` (the model calls it with ``[3, 1, N]``).

The pipeline packs ``[text][vision][sound][action]`` (``get_3d_mrope_ids_text_tokens`` /
``get_3d_mrope_ids_vae_tokens``): text token ``j`` at ``(j, j, j)``; vision tokens at ``(offset + f, row, col)``
with ``offset`` = the text length plus ``unified_3d_mrope_temporal_modality_margin`` (15000), rows and columns from 0
(``unified_3d_mrope_reset_spatial_ids``; with fps modulation the time ids are fractional, scaled by fps); sound and
action tokens after them. One float32 ladder over the head (``1 / theta ** (2j / head_dim)``, theta 5e6, a buffer
that follows ``model.to``), pair ``j`` reading ``h`` when ``j % 3 == 1`` and ``j < 3 * rope_axes_dim[1]``, ``w`` when
``j % 3 == 2`` and ``j < 3 * rope_axes_dim[2]``, ``t`` otherwise (the layout of :mod:`.ideogram4`), float32 phases,
``(cos, sin)`` in the half layout cast to the hidden states' dtype. The vision tokens (``vision_sequence_indexes``)
get the schedule's spectrum, resolved at their rows, columns and frames; text, sound and action tokens keep the
training spectrum. The pipeline passes the scheduler's timesteps per noisy vision token (``vision_timesteps``,
1000 sigma).
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family
from .codecs import forward_arg, masked_extents
from .ideogram4 import InterleavedSeam, interleaved_cos_sin


def _axes_dims(model) -> tuple[int, int, int]:
    """Channels per axis ``(t, h, w)``: ``h`` and ``w`` take ``2 * rope_axes_dim``, ``t`` the rest of the head."""
    head_dim = int(model.config.head_dim)
    _, rows, cols = (int(s) for s in model.config.rope_axes_dim)
    return head_dim - 2 * rows - 2 * cols, 2 * rows, 2 * cols


def _make_seam(model, stock, encodings, native, coord_axes):
    (encoding,) = encodings
    return InterleavedSeam(COSMOS3, encoding, stock, _axes_dims(model), float(model.config.rope_theta))


def _note_vision_tokens(seam, args, kwargs) -> None:
    """Record where the forward's vision tokens sit in the packed sequence (they get the schedule's spectrum)."""
    seam.vision_indexes = forward_arg(args, kwargs, "vision_sequence_indexes", 7)


def cosmos3_tables(seam, position_ids: torch.Tensor, device, dtype):
    """The stock output ``(cos, sin)`` ``[B, N, head_dim]`` in ``dtype`` of ``position_ids`` ``[3, B, N]`` (or ``[B, N]``,
    one id for all three axes)."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() not in (2, 3):
        shape = tuple(position_ids.shape) if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
        raise ValueError(f"position_ids has shape {shape}; expected [3, B, N] (t, h, w) or [B, N]")
    if position_ids.dim() == 2:
        position_ids = position_ids[None].expand(3, -1, -1)
    pos = position_ids.float().permute(1, 2, 0).to(device)  # [B, N, 3]
    is_image = torch.zeros(pos.shape[1], dtype=torch.bool, device=device)
    indexes = getattr(seam, "vision_indexes", None)
    if isinstance(indexes, torch.Tensor) and indexes.numel():
        is_image[indexes.to(device)] = True
    text = seam.training_spectra()
    image = seam.axis_spectra(extents=lambda: masked_extents(pos[0], is_image) if bool(is_image.any()) else None)
    cos, sin = interleaved_cos_sin(seam, pos, text)
    if image is not text and not all(a.is_stock and b.is_stock for a, b in zip(text, image)):
        image_cos, image_sin = interleaved_cos_sin(seam, pos, image)
        cos = torch.where(is_image[:, None], image_cos, cos)
        sin = torch.where(is_image[:, None], image_sin, sin)
    return cos.to(dtype=dtype), sin.to(dtype=dtype)


COSMOS3 = register_family(
    Family(
        name="cosmos3",
        classes=("diffusers.models.transformers.transformer_cosmos3:Cosmos3OmniTransformer",),
        position_attr="rotary_emb",
        axis_names=("t", "h", "w"),
        native_axes_dims=_axes_dims,
        native_theta=lambda model: float(model.config.rope_theta),
        image_axes=(1, 2),
        time_axis=0,
        tables=cosmos3_tables,
        make_seam=_make_seam,
        check_inputs=_note_vision_tokens,
        timestep_per_sigma=1000.0,
        timestep_arg=("vision_timesteps", 9),
        pipelines=("Cosmos3OmniPipeline",),
        train_size=720,
        pixels_per_token=32,  # 16x VAE, latent patch 2
        notes="MRoPE-I (interleaved) over the packed sequence's position_ids; vision tokens get the schedule, text, "
        "sound and action the training spectrum",
        extras={"allocation": "interleaved"},
    )
)
