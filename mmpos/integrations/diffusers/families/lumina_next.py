"""Lumina-Next (``LuminaNextDiT2DModel``, ``LuminaPipeline``): the pipeline builds the rotary table and passes it as
``forward(image_rotary_emb=...)`` (:mod:`.rotary_input`), scaled by its own resolution rule.

``LuminaPipeline`` calls ``get_2d_rotary_pos_embed_lumina(D, 384, 384, linear_factor, ntk_factor)`` at every step: a
complex64 table ``[384, 384, D / 2]`` (``D`` the head size), pairs alternating row and column (``[r0 c0 r1 c1 ...]``),
each axis ``get_1d_rotary_pos_embed(D / 2, arange(384), theta=10000 * ntk_factor, linear_factor=...)`` (float32);
the model reads its ``[:H / p, :W / p]`` corner. With ``s = sqrt(H W) / sample_size`` (latent sizes: the image's
side over the training side), the pipeline's Lumina-Next time-aware scaling divides every frequency by ``s`` (PI)
while the step's ``t < scaling_watershed`` (a call argument, default 1.0: every step) and otherwise raises theta to
``10000 s`` (NTK). At the training size ``s = 1``: the plain ladder.

``native`` keeps the pipeline's table (and its scaling); any other spectrum **takes the place of the pipeline's
scaling**: the corner the model reads is rebuilt from the plain ladder (integer positions, float32) with mmpos'
frequencies per axis, so ``extrapolation=`` chooses the method (DyPE, YaRN, ...) instead of the pipeline's PI / NTK
switch. A table that is neither of the pipeline's two for the forward's size is refused by name. The pipeline passes
``t = 1 - timestep / 1000`` (0 is noise).
"""

from __future__ import annotations

import math

import torch

from . import register_family
from .base import check_latents
from .codecs import axis_frequencies, forward_arg
from .rotary_input import RotaryInput, rotary_input_family

SIDE = 384  # the pipeline's table side
VAE_SCALE = 8  # LuminaPipeline's VAE (SDXL): pixels per latent


def axes_dims(model) -> tuple[int, int]:
    d = int(model.config.hidden_size) // int(model.config.num_attention_heads)
    return (d // 2, d // 2)


def latent_grid(config, args, kwargs) -> tuple[int, int]:
    """``(H / p, W / p)`` of the forward's hidden states ``[B, C, H, W]``, and the latent ``(H, W)``."""
    hidden_states = forward_arg(args, kwargs, "hidden_states", 0)
    check_latents(hidden_states, "[B, C, H, W]")
    height, width = (int(n) for n in hidden_states.shape[-2:])
    p = int(config.patch_size)
    return height // p, width // p, height, width


def positions(config, grid, device):
    rows, cols = grid[:2]
    return [torch.arange(rows, device=device), torch.arange(cols, device=device)], (rows, cols)


def pipeline_scale(config, grid) -> float:
    """``LuminaPipeline``'s ``scaling_factor``: ``sqrt(width * height / default_image_size ** 2)`` in pixels."""
    height, width = grid[2:]
    default = int(config.sample_size) * VAE_SCALE
    return math.sqrt(VAE_SCALE * width * VAE_SCALE * height / default**2)


def _corner(seam, axis_positions, spectra, linear_factor=1.0, ntk_factor=1.0):
    """``[rows, cols, D / 2]`` complex64: ``get_2d_rotary_pos_embed_lumina``'s layout on the corner the model reads."""
    rows, cols = (len(p) for p in axis_positions)
    dim = seam.axes_dims[0]
    per_axis = []
    for pos, spectrum in zip(axis_positions, spectra):
        if spectrum.inv_freq is None:  # the stock ladder, with the pipeline's factors
            theta = seam.theta * ntk_factor
            freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=pos.device) / dim))
            freqs = freqs / linear_factor
        else:
            freqs = axis_frequencies(spectrum, dim, seam.theta, torch.float32, pos.device)
        phases = torch.outer(pos, freqs)
        per_axis.append(torch.polar(torch.full_like(phases, spectrum.magnitude), phases))
    emb_h = per_axis[0].view(rows, 1, dim // 2, 1).repeat(1, cols, 1, 1)
    emb_w = per_axis[1].view(1, cols, dim // 2, 1).repeat(rows, 1, 1, 1)
    return torch.cat([emb_h, emb_w], dim=-1).flatten(2)


def tables(seam, axis_positions, counts, spectra, stock):
    """A changed spectrum: the corner the model reads, from the plain ladder with mmpos' frequencies. The training
    spectrum (the stock check): ``stock`` with that corner rebuilt as the pipeline builds it for this size (its PI or
    its NTK branch, whichever is nearer ``stock``), so any other table is found."""
    if not all(s.inv_freq is None and s.magnitude == 1.0 for s in spectra):
        return _corner(seam, axis_positions, spectra)
    rows, cols = counts
    scale = pipeline_scale(seam.config, seam.grid)
    candidates = [
        _corner(seam, axis_positions, spectra, linear_factor=scale),
        _corner(seam, axis_positions, spectra, ntk_factor=scale),
    ]
    if not isinstance(stock, torch.Tensor) or stock.dim() != 3 or stock.shape[0] < rows or stock.shape[1] < cols:
        return candidates[0]  # the check reports the shapes
    corner = stock[:rows, :cols].to(candidates[0].device)
    best = min(candidates, key=lambda c: float((c - corner).abs().max()))
    out = stock.clone()
    out[:rows, :cols] = best.to(out.device, out.dtype)
    return out


LUMINA_NEXT = register_family(
    rotary_input_family(
        name="lumina_next",
        classes=("diffusers.models.transformers.lumina_nextdit2d:LuminaNextDiT2DModel",),
        axis_names=("row", "col"),
        native_axes_dims=axes_dims,
        native_theta=lambda model: 10000.0,
        image_axes=(0, 1),
        rotary_input=RotaryInput(
            grid=latent_grid,
            positions=positions,
            build=tables,
            builder="get_2d_rotary_pos_embed_lumina (LuminaPipeline, with its linear_factor / ntk_factor)",
        ),
        timestep_per_sigma=-1.0,  # LuminaPipeline passes t = 1 - timestep / 1000 (0 is noise)
        timestep_at_zero_sigma=1.0,
        pipelines=("LuminaPipeline",),
        train_size=1024,
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="the pipeline builds a 384 x 384 table scaled by its own rule (PI or NTK by sqrt(H W) / training side); "
        "set_pe native keeps it, any other spectrum takes the place of that scaling",
    )
)
