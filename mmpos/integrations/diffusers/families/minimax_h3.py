"""MiniMax H3 (``MiniMaxH3Transformer3DModel``, joint video + audio, modular pipeline): ``MiniMaxH3RotaryPosEmbed``.

One packed sequence (text, conditioning and target video rows, audio rows); the model calls ``rope(position_ids)``
once per forward with the pipeline's ``position_ids`` ``[S, 3]`` (``(t, h, w)`` per row, float64 from the
``before_denoise`` block: text at ``(j, 0, 0)``; video rows at their frame's rotary time, spaced ``5/3 * (1, 4, 4, ...)``,
and an aspect-normalised spatial grid spanning ``[0, 32)`` for a square canvas; audio rows on ``t`` and ``w``).
The stock module: ``inv_freq = 1 / theta ** (arange(0, 2F, 2) / 2F)`` float32 (a buffer: it follows the model's
casts), phases ``position_ids.float() * inv_freq`` per axis, ``(cos, sin)`` ``[S, 6F]`` of ``cat(t, h, w)`` twice
(half layout: the processor's ``rotate_half`` rotates the leading ``6F`` channels of each head).

Schedules read the video rows only (``token_tags == 0``, recorded before each forward); text and audio rows keep the
training spectrum. The spatial coordinates are normalised (a larger canvas is a denser grid of the same span), so a
schedule's extent is the number of distinct positions per axis among the video rows, in tokens (CogView4 alike): at
twice the trained grid the scale is 2. The pipeline's ``timestep`` is ``1 - sigma`` (``MiniMaxH3Scheduler``), the
distinct values of the sequence, sorted: the first is the noisiest.

Context parallelism (diffusers' plan splits the rope's outputs) is not verified: refused by name.
"""

from __future__ import annotations

import torch

from . import register_family
from .base import CastFollowingSeam, Family, SpectrumSeam
from .codecs import forward_arg, ladder, same_spectra

VIDEO_TAG = 0  # token_tags: 0 video, 1 text, 2 audio


def _stock(model):
    rope = model.rope
    return rope.stock[0] if isinstance(rope, SpectrumSeam) else rope


def _half_table(seam, pos: torch.Tensor, spectra):
    """``(cos, sin)`` ``[S, 6F]`` of ``pos [S, 3]`` float32: per axis the stock ladder (rounded to the stock buffer's
    dtype) or the spectrum's frequencies in float32, ``cat(t, h, w)`` twice."""
    probe = seam.native_dtype_probe
    parts = []
    for axis, (dim, spectrum) in enumerate(zip(seam.axes_dims, spectra)):
        if spectrum.inv_freq is None:
            freq = ladder(dim, seam.theta, torch.float32, pos.device).to(probe.dtype)
        else:
            freq = spectrum.inv_freq.to(pos.device, torch.float32)
        parts.append(pos[:, axis : axis + 1] * freq)
    freqs = torch.cat(parts, dim=-1)
    freqs = torch.cat((freqs, freqs), dim=-1)
    cos, sin = freqs.cos(), freqs.sin()
    magnitudes = [s.magnitude for s in spectra]
    if any(m != 1.0 for m in magnitudes):
        scale = torch.cat([torch.full((d // 2,), m, device=pos.device) for d, m in zip(seam.axes_dims, magnitudes)])
        scale = torch.cat((scale, scale))
        cos, sin = cos * scale, sin * scale
    return cos, sin


def distinct_positions(pos: torch.Tensor, rows: torch.Tensor) -> list[float]:
    """Per axis, the number of distinct positions among the ``rows`` (bool ``[S]``) of ``pos [S, A]`` (a sync)."""
    chosen = pos[rows]
    return [float(torch.unique(chosen[:, axis]).numel()) for axis in range(pos.shape[1])]


def minimax_h3_tables(seam, position_ids: torch.Tensor):
    """The stock ``(cos, sin)`` ``[S, 6F]`` float32 of ``position_ids [S, 3]`` (module docstring)."""
    if position_ids.ndim != 2 or position_ids.shape[-1] != 3:
        raise ValueError(f"position_ids have shape {tuple(position_ids.shape)}; expected [S, 3] (t, h, w per row)")
    pos = position_ids.to(torch.float32)
    video = getattr(seam, "video_rows", None)
    if not seam.scheduled or video is None or video.shape != pos.shape[:1]:
        return _half_table(seam, pos, seam.axis_spectra())
    training = seam.training_spectra()
    image = seam.axis_spectra(extents=lambda: distinct_positions(pos, video))
    if same_spectra(training, image):
        return _half_table(seam, pos, image)
    video_cos, video_sin = _half_table(seam, pos, image)
    other_cos, other_sin = _half_table(seam, pos, training)
    rows = video.to(pos.device)[:, None]
    return torch.where(rows, video_cos, other_cos), torch.where(rows, video_sin, other_sin)


def check_inputs(seam, args, kwargs) -> None:
    """Record the forward's video rows (``token_tags == 0``) for the schedules' extents."""
    tags = forward_arg(args, kwargs, "token_tags", 5)
    seam.video_rows = tags == VIDEO_TAG if isinstance(tags, torch.Tensor) else None


def _make_seam(model, stock, encodings, native, coord_axes):
    (encoding,) = encodings
    seam = CastFollowingSeam(
        MINIMAX_H3, encoding, stock, _axes_dims(model), float(model.config.rope_theta), probe="inv_freq"
    )
    return seam


def _axes_dims(model):
    return (2 * int(_stock(model).rope_freq_dim),) * 3


MINIMAX_H3 = register_family(
    Family(
        name="minimax_h3",
        classes=("diffusers.models.transformers.transformer_minimax_h3:MiniMaxH3Transformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=_axes_dims,
        native_theta=lambda model: float(model.config.rope_theta),
        image_axes=(1, 2),
        time_axis=0,
        tables=minimax_h3_tables,
        make_seam=_make_seam,
        check_inputs=check_inputs,
        timestep_per_sigma=-1.0,  # MiniMaxH3Scheduler: timesteps = 1 - sigma
        timestep_at_zero_sigma=1.0,
        timestep_arg=("timestep", 3),
        pipelines=("MiniMaxH3ModularPipeline",),
        train_size=768,  # canvas_short_edge of the released checkpoint
        pixels_per_token=32,  # VAE 16 x patch 2
        notes="packed video / audio / text positions from the pipeline; schedules on the video rows (token counts)",
    )
)
