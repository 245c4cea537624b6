"""NucleusMoE-Image (``NucleusMoEImageTransformer2DModel``): ``NucleusMoEEmbedRope``, Qwen-Image's centred MSRoPE.

The model calls ``pos_embed(img_shapes, max_txt_seq_len=L, device=...)`` once per forward. Image ``i`` of the first
sample's shapes (``f x h x w`` tokens) gets the coordinates ``(i + frame, row - (h - h // 2), col - (w - w // 2))``
(rows and columns centred), the text tokens ``m + j`` on all three axes, with ``m = max(h // 2, w // 2)`` of the
**last** image. The stock module precomputes complex64 tables ``polar(1, index * inv_freq)`` (float32 ladder
``1 / theta ** (2i / d)``, float32 phases) on the CPU for indices ``-4096 .. 4095`` and gathers them; here the same
CPU rows are computed for the positions used (:class:`~.codecs.PrecomputedRows`), so native is the stock table bit for
bit and larger grids just work. Output ``(image [S_img, P], text [S_txt, P])`` complex64. The text keeps the training
spectrum; a schedule's scale is read from the image tokens. The pipeline passes ``timestep = t / 1000 = sigma``.
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family, extents_of
from .codecs import complex_pairs, precomputed_rows


def nucleus_coords(video_fhw, max_txt_seq_len) -> tuple[torch.Tensor, torch.Tensor]:
    """``(image [S_img, 3], text [S_txt, 3])`` integer coordinates of ``NucleusMoEEmbedRope.forward``'s tokens."""
    if isinstance(video_fhw, list):
        video_fhw = video_fhw[0]  # the stock module uses the first sample's shapes for the batch
    shapes = video_fhw if isinstance(video_fhw, list) else [video_fhw]
    if not shapes:
        raise ValueError("img_shapes is empty; expected (frames, rows, cols) per image")
    images = []
    for index, (frames, height, width) in enumerate(shapes):
        t = torch.arange(index, index + frames)
        r = torch.arange(height) - (height - height // 2)
        c = torch.arange(width) - (width - width // 2)
        images.append(torch.stack(torch.meshgrid(t, r, c, indexing="ij"), dim=-1).reshape(-1, 3))
    last = max(height // 2, width // 2)  # the last image's, as the stock loop leaves it
    text = torch.arange(last, last + int(max_txt_seq_len))
    return torch.cat(images), text[:, None].expand(-1, 3)


def nucleus_tables(seam, video_fhw, device=None, max_txt_seq_len=None):
    """The stock output ``(image [S_img, P], text [S_txt, P])`` complex64 on ``device``."""
    if max_txt_seq_len is None:
        raise ValueError("max_txt_seq_len must be given (the text length), as for the stock NucleusMoEEmbedRope")
    image, text = nucleus_coords(video_fhw, max_txt_seq_len)
    image, text = image.to(device), text.to(device)
    rows = precomputed_rows(seam, freqs_dtype=torch.float32)
    text_spectra = seam.training_spectra()
    image_spectra = seam.axis_spectra(extents=lambda: extents_of(image))
    image_table = complex_pairs(image, image_spectra, seam.axes_dims, seam.theta, torch.float32, rows=rows)
    text_table = complex_pairs(text, text_spectra, seam.axes_dims, seam.theta, torch.float32, rows=rows)
    return image_table, text_table


NUCLEUSMOE_IMAGE = register_family(
    Family(
        name="nucleusmoe_image",
        classes=("diffusers.models.transformers.transformer_nucleusmoe_image:NucleusMoEImageTransformer2DModel",),
        position_attr="pos_embed",
        axis_names=("frame", "row", "col"),  # rows and columns centred on the image
        native_axes_dims=lambda model: tuple(int(d) for d in model.pos_embed.axes_dim),
        native_theta=lambda model: float(model.pos_embed.theta),
        image_axes=(1, 2),
        tables=nucleus_tables,
        timestep_per_sigma=1.0,  # the pipeline passes t / num_train_timesteps = sigma
        timestep_arg=("timestep", 4),
        pipelines=("NucleusMoEImagePipeline",),
        train_size=1024,
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="Qwen-Image's centred MSRoPE; CPU-precomputed rows computed for any position; text on the training "
        "spectrum",
    )
)
