"""Ideogram 4 (``Ideogram4Transformer2DModel``, ``Ideogram4Pipeline``): ``Ideogram4MRoPE``, Qwen3-VL's interleaved
multimodal RoPE on the pipeline's ``position_ids [B, L, 3]``.

The pipeline packs ``[left padding][text][image]`` per sample: text token ``j`` at ``(j, j, j)``, image tokens at
``(0, row, col) + 65536`` (the offset keeps them apart from the text), and an ``indicator`` per token (text 3, image
2). The model calls ``rotary_emb(position_ids)`` once per forward: one float32 ladder over the head
(``1 / theta ** (2j / head_dim)``, theta 5e6), pair ``j`` reading axis ``h`` when ``j % 3 == 1`` and
``j < 3 * mrope_section[1]``, ``w`` when ``j % 3 == 2`` and ``j < 3 * mrope_section[2]``, ``t`` otherwise (MRoPE-I:
every axis spans the whole frequency range); float32 phases, ``(cos, sin)`` ``[B, L, head_dim]`` in the half layout. The ladder is a buffer: after
``model.to(bfloat16)`` it holds bf16-rounded frequencies, and so does the seam (``native_dtype_probe``).
mmpos builds the native spectrum with the same allocation (``allocation="interleaved"``,
:func:`~mmpos.spectrum.allocation.interleaved_spectrum`), so an extrapolation scales each axis' own pairs of the
one ladder. The image tokens (``indicator == 2``) get the schedule's spectrum, resolved at their rows and columns; the
text tokens keep the training spectrum. The pipeline passes ``timestep = 1 - sigma`` (0 is noise).
"""

from __future__ import annotations

import torch

from ....spectrum.allocation import interleaved_spectrum
from . import register_family
from .base import STOCK, AxisSpectrum, CastFollowingSeam, Family
from .codecs import forward_arg, ladder, masked_extents

OUTPUT_IMAGE_INDICATOR = 2  # diffusers' transformer_ideogram4.OUTPUT_IMAGE_INDICATOR


def _axes_dims(model) -> tuple[int, int, int]:
    """Channels per axis ``(t, h, w)``: ``h`` and ``w`` take ``2 * mrope_section``, ``t`` the rest of the head."""
    head_dim = int(model.config.attention_head_dim)
    _, rows, cols = (int(s) for s in model.config.mrope_section)
    return head_dim - 2 * rows - 2 * cols, 2 * rows, 2 * cols


class InterleavedSeam(CastFollowingSeam):
    """The tier-1 seam of an interleaved (MRoPE-I) spectrum: each axis' pairs are picked by ``axis_of_pair``, not a
    contiguous block; ``native_dtype_probe`` follows the stock ``inv_freq`` buffer's casts."""

    def __init__(self, family, encoding, stock, axes_dims, theta):
        super().__init__(family, encoding, stock, axes_dims, theta, probe="inv_freq")
        self._plain = interleaved_spectrum(self.axes_dims, self.theta)
        self.axis_of_pair = self._plain.axis_of_pair

    def _split(self, spectrum) -> list[AxisSpectrum]:
        out = []
        for axis in range(len(self.axes_dims)):
            mine = spectrum.axis_of_pair == axis
            inv, mag = spectrum.inv_freq[mine], spectrum.magnitude[mine]
            if not bool((mag == mag[0]).all()):
                raise ValueError(
                    "a per-pair magnitude inside one axis (pair_scale) is not supported by the stock "
                    "processors of a tier-1 family; use a tier-2 family"
                )
            same = torch.equal(inv, self._plain.inv_freq[mine])
            out.append(
                STOCK if same and float(mag[0]) == 1.0 else AxisSpectrum(None if same else inv.clone(), float(mag[0]))
            )
        return out


def _make_seam(model, stock, encodings, native, coord_axes):
    (encoding,) = encodings
    return InterleavedSeam(IDEOGRAM4, encoding, stock, _axes_dims(model), float(model.config.rope_theta))


def _note_indicator(seam, args, kwargs) -> None:
    """Record the forward's token roles (the image tokens get the schedule's spectrum)."""
    seam.indicator = forward_arg(args, kwargs, "indicator", 5)


def interleaved_cos_sin(seam, pos: torch.Tensor, spectra) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``[B, L, head_dim]`` float32 (half layout) of ``pos [B, L, 3]`` float32 on ``spectra``."""
    head_dim = sum(seam.axes_dims)
    axis_of_pair = seam.axis_of_pair.to(pos.device)
    # the stock ladder as its buffer holds it (rounded to the model's dtype by a cast), read back in float32
    freq = ladder(head_dim, seam.theta, torch.float32, pos.device).to(seam.native_dtype_probe.dtype).float()
    magnitude = None
    for axis, spectrum in enumerate(spectra):
        if spectrum.inv_freq is not None:
            freq[axis_of_pair == axis] = spectrum.inv_freq.to(pos.device, torch.float32)
        if spectrum.magnitude != 1.0:
            magnitude = torch.ones_like(freq) if magnitude is None else magnitude
            magnitude[axis_of_pair == axis] = spectrum.magnitude
    with torch.autocast(device_type=pos.device.type, enabled=False):
        phases = pos[..., axis_of_pair] * freq  # [B, L, head_dim / 2]
    emb = torch.cat((phases, phases), dim=-1)
    cos, sin = emb.cos().float(), emb.sin().float()
    if magnitude is not None:
        magnitude = torch.cat((magnitude, magnitude))
        cos, sin = cos * magnitude, sin * magnitude
    return cos, sin


def ideogram4_tables(seam, position_ids: torch.Tensor):
    """The stock output ``(cos, sin)`` ``[B, L, head_dim]`` float32 of ``position_ids [B, L, 3]``."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 3 or position_ids.shape[-1] != 3:
        shape = tuple(position_ids.shape) if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
        raise ValueError(f"position_ids has shape {shape}; expected (B, L, 3) (t, h, w)")
    pos = position_ids.to(dtype=torch.float32)
    indicator = getattr(seam, "indicator", None)
    is_image = indicator == OUTPUT_IMAGE_INDICATOR if isinstance(indicator, torch.Tensor) else None
    text = seam.training_spectra()
    image = seam.axis_spectra(extents=lambda: masked_extents(pos[0], is_image[0]) if is_image is not None else None)
    cos, sin = interleaved_cos_sin(seam, pos, text)
    if is_image is not None and image is not text and not all(a.is_stock and b.is_stock for a, b in zip(text, image)):
        image_cos, image_sin = interleaved_cos_sin(seam, pos, image)
        cos = torch.where(is_image[..., None], image_cos, cos)
        sin = torch.where(is_image[..., None], image_sin, sin)
    return cos, sin


IDEOGRAM4 = register_family(
    Family(
        name="ideogram4",
        classes=("diffusers.models.transformers.transformer_ideogram4:Ideogram4Transformer2DModel",),
        position_attr="rotary_emb",
        axis_names=("t", "h", "w"),
        native_axes_dims=_axes_dims,
        native_theta=lambda model: float(model.config.rope_theta),
        image_axes=(1, 2),
        tables=ideogram4_tables,
        make_seam=_make_seam,
        check_inputs=_note_indicator,
        timestep_per_sigma=-1.0,  # Ideogram4Pipeline passes 1 - sigma (0 is noise, 1 clean)
        timestep_at_zero_sigma=1.0,
        timestep_arg=("timestep", 1),
        pipelines=("Ideogram4Pipeline",),
        train_size=1024,
        pixels_per_token=16,
        notes="MRoPE-I (interleaved) on the pipeline's position_ids; image tokens (indicator 2) get the schedule, "
        "text the training spectrum",
        extras={"allocation": "interleaved"},
    )
)
