"""CogView4 (``CogView4Transformer2DModel``; T2I and Control): ``CogView4RotaryPosEmbed`` on the latents.

The model calls ``rope(hidden_states)`` once per forward on the latents ``[B, C, H, W]``; only the image tokens
are rotated (the text tokens before them get no rotary position). Axes ``(row, col)`` with ``head_dim / 2``
channels each, theta 10000, float32 phases computed on the CPU, half layout: ``[h | w | h | w]`` pairs, i.e.
channel ``j`` and ``j + head_dim / 2`` share a phase. Positions are **normalised to a fixed extent**: row ``i`` of
``n`` rows sits at ``floor(i * rope_axes_dim[0] / n)`` (``rope_axes_dim = (256, 256)``), so the positions span
``0 .. 255`` at every resolution and a larger image only packs them closer (the model interpolates by itself).

A schedule's scale therefore cannot come from the positions (their extent is about ``rope_axes_dim`` at every size):
the extents given to the schedule are the **token counts** ``(H / patch, W / patch)``, compared with the
``trained_grid`` in tokens (CogView4 at 1024 px: ``(64, 64)``). The rows keep their stock normalised positions and
get the schedule's frequencies, so a preset acts on top of the model's own interpolation (at 2x, ``"pi"`` halves
the already halved position steps once more; NTK / YaRN / DyPE lower the low frequencies further). At or below
the trained token counts every preset is stock bit for bit. Tables are computed from the positions (no table is
indexed) and returned on the CPU, as the stock module does (the processors move them to the activations' device).
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family, check_latents
from .codecs import axis_frequencies


def cogview4_positions(size: int, extent: int) -> torch.Tensor:
    """The stock normalised positions ``floor(i * extent / size)`` of ``size`` tokens, float32 ``[size]``."""
    return (torch.arange(size) * extent // size).float()


def cogview4_tables(seam, hidden_states: torch.Tensor):
    """The stock output ``(cos, sin)`` ``[H * W, head_dim]`` float32 on the CPU for latents ``[B, C, H, W]``."""
    check_latents(hidden_states, "[B, C, H, W]")
    stock = seam.stock[0]
    height, width = hidden_states.shape[2] // stock.patch_size, hidden_states.shape[3] // stock.patch_size
    spectra = seam.axis_spectra(extents=[float(height), float(width)])
    positions = [cogview4_positions(size, int(extent)) for size, extent in zip((height, width), stock.rope_axes_dim)]
    return half_layout_tables(seam, positions, spectra)


def half_layout_tables(seam, positions, spectra):
    """``(cos, sin)`` ``[H * W, D]`` float32 on the CPU of the grid ``positions = (rows [H], cols [W])`` (float32):
    per token ``[row phases | col phases]`` twice (the half layout), phases ``outer(pos, inv_freq)`` in float32."""
    height, width = (int(p.shape[0]) for p in positions)
    phases = []
    for pos, dim, spectrum in zip(positions, seam.axes_dims, spectra):
        phases.append(torch.outer(pos, axis_frequencies(spectrum, dim, seam.theta, torch.float32)))
    freqs_h = phases[0].unsqueeze(1).expand(height, width, -1)
    freqs_w = phases[1].unsqueeze(0).expand(height, width, -1)
    freqs = torch.cat([freqs_h, freqs_w], dim=-1)
    freqs = torch.cat([freqs, freqs], dim=-1).reshape(height * width, -1)
    cos, sin = freqs.cos(), freqs.sin()
    if any(s.magnitude != 1.0 for s in spectra):
        magnitude = torch.cat([torch.full((dim // 2,), s.magnitude) for dim, s in zip(seam.axes_dims, spectra)])
        magnitude = torch.cat([magnitude, magnitude])
        cos, sin = cos * magnitude, sin * magnitude
    return cos, sin


COGVIEW4 = register_family(
    Family(
        name="cogview4",
        classes=("diffusers.models.transformers.transformer_cogview4:CogView4Transformer2DModel",),
        position_attr="rope",
        axis_names=("row", "col"),
        native_axes_dims=lambda model: (int(model.config.attention_head_dim) // 2,) * 2,
        native_theta=lambda model: 10000.0,  # the model builds its rope with theta=10000.0
        image_axes=(0, 1),
        tables=cogview4_tables,
        timestep_per_sigma=1000.0,  # the pipelines pass the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", 2),
        pipelines=("CogView4Pipeline", "CogView4ControlPipeline"),
        train_size=1024,  # sample_size 128 latents
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="positions normalised to rope_axes_dim; schedule scale from token counts",
    )
)
