"""ERNIE-Image (``ErnieImageTransformer2DModel``): ``ErnieImageEmbedND3`` on ``ids [B, S, 3]``, returning **phases**.

The model calls ``pos_embed(ids)`` once per forward on ``cat(image_ids, text_ids)``: the image tokens first, at
``(text length of the sample, row, col)`` of the patch grid, then the padded text ``(j, 0, 0)``. Axes
``(index, row, col)`` with ``rope_axes_dim = (32, 48, 48)``, theta 256; the output is the phases themselves,
``[B, S, 1, head_dim]`` float32 (``ids * inv_freq`` per axis, float32 ladder ``1 / theta ** (2i / d)``, each pair's
phase repeated), which the processor turns into cos and sin (half layout). The image tokens are the rows before
the text (as many text rows as ``text_bth`` has tokens); a schedule's scale is read from their rows and
columns, the text keeps the training spectrum. Phase tables carry no magnitude: a spectrum that scales cos and sin
(YaRN's attention factor, the default DyPE's) is refused by name; DyPE runs through NTK (``method="ntk"``). The pipeline passes the scheduler's timesteps (``1000 sigma``).
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family, extents_of, ids_values_key
from .codecs import axis_frequencies, forward_arg, note_text_tokens


def _text_tokens(args, kwargs) -> int:
    """The forward's padded text tokens (``text_bth [B, T, D]``'s ``T``): the last rows of the ids."""
    text = forward_arg(args, kwargs, "text_bth", 2)
    return text.shape[1] if isinstance(text, torch.Tensor) and text.dim() == 3 else 0


def _phases(pos: torch.Tensor, spectra, seam) -> torch.Tensor:
    """``[B, S, 1, D]`` float32 phases of ``pos [B, S, 3]``, each pair's value repeated."""
    parts = []
    for axis, (dim, spectrum) in enumerate(zip(seam.axes_dims, spectra)):
        if spectrum.magnitude != 1.0:
            raise ValueError(
                "ERNIE-Image's rope returns phases, which cannot carry a magnitude (YaRN's attention factor, got "
                f"{spectrum.magnitude} on axis {seam.family.axis_names[axis]}); use pi / ntk, or DyPE through NTK: "
                'model_extrapolation(model, "dype", trained_grid, method="ntk")'
            )
        omega = axis_frequencies(spectrum, dim, seam.theta, torch.float32, pos.device)
        with torch.autocast(device_type=pos.device.type, enabled=False):
            parts.append((pos[..., axis, None].float() * omega).float())
    phases = torch.cat(parts, dim=-1).unsqueeze(2)
    return torch.stack([phases, phases], dim=-1).reshape(*phases.shape[:-1], -1)


def ernie_image_tables(seam, ids: torch.Tensor) -> torch.Tensor:
    """The stock output ``[B, S, 1, sum(axes_dims)]`` float32 phases of ``ids [B, S, 3]`` (image rows first)."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 3 or ids.shape[-1] != len(seam.axes_dims):
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids has shape {shape}; expected [B, S, {len(seam.axes_dims)}]")
    images = ids.shape[1] - min(max(int(getattr(seam, "text_tokens", 0)), 0), ids.shape[1])
    text_spectra = seam.training_spectra()
    image_spectra = seam.axis_spectra(extents=lambda: extents_of(ids[0, :images]))
    if image_spectra is text_spectra or images == ids.shape[1]:
        return _phases(ids, image_spectra, seam)
    return torch.cat([_phases(ids[:, :images], image_spectra, seam), _phases(ids[:, images:], text_spectra, seam)], 1)


ERNIE_IMAGE = register_family(
    Family(
        name="ernie_image",
        classes=("diffusers.models.transformers.transformer_ernie_image:ErnieImageTransformer2DModel",),
        position_attr="pos_embed",
        axis_names=("index", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.pos_embed.axes_dim),
        native_theta=lambda model: float(model.pos_embed.theta),
        image_axes=(1, 2),
        tables=ernie_image_tables,
        tables_key=ids_values_key,
        check_inputs=note_text_tokens(_text_tokens),
        timestep_per_sigma=1000.0,  # ErnieImagePipeline passes the scheduler's timesteps
        timestep_arg=("timestep", 1),
        pipelines=("ErnieImagePipeline",),
        train_size=1024,
        pixels_per_token=16,  # 16x VAE, patch 1
        notes="phase tables (no magnitude: YaRN's attention factor refused); image tokens first; text on the "
        "training spectrum",
    )
)
