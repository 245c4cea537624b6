"""SkyReels-V2 (``SkyReelsV2Transformer3DModel``; T2V, I2V, diffusion forcing): ``SkyReelsV2RotaryPosEmbed``.

Wan's rope in another class: axes ``(t, row, col)`` with ``h = w = 2 * (head_dim // 6)`` channels and the rest on
time, theta 10000. At init it precomputes ``(cos, sin)`` buffers for positions ``0 .. rope_max_seq_len - 1`` (float64
phases on the CPU, rounded to float32, then following the model's casts); each forward slices them to the latents'
patch grid and returns ``(cos, sin)`` ``[1, F * H * W, 1, head_dim]``, pairs repeated. Here the per-axis tables are
computed from the positions (the same float64 CPU arithmetic, so native is the stock buffers bit for bit) and
expanded to the grid as the stock module does: a grid beyond ``rope_max_seq_len`` just works. Diffusion forcing passes
per-frame timesteps ``[B, F]`` (clean frames at 0): the step's sigma is the noisiest frame's
(:meth:`~.base.Family.sigma`). Only video tokens are rotated (cross-attention to text has none).
"""

from __future__ import annotations

import torch

from . import register_family
from .base import CameraSite, Family, check_latents, latent_video_grid
from .codecs import cos_sin_repeated


def _axes_dims(model):
    head_dim = int(model.config.attention_head_dim)
    h_dim = w_dim = 2 * (head_dim // 6)
    return (head_dim - h_dim - w_dim, h_dim, w_dim)


def _stock_freqs_dtype() -> torch.dtype:
    """The stock module's phase precision (float32 where MPS is available, as it decides)."""
    return torch.float32 if torch.backends.mps.is_available() else torch.float64


def skyreels_tables(seam, hidden_states: torch.Tensor):
    """The stock output ``(cos, sin)`` ``[1, F * H * W, 1, head_dim]`` in the buffers' dtype, on their device."""
    sizes = latent_patch_grid_3d(seam, hidden_states)
    spectra = seam.axis_spectra(extents=[float(n) for n in sizes])
    freqs_dtype = _stock_freqs_dtype()
    probe = seam.native_dtype_probe
    cos_axes, sin_axes = [], []
    for n, dim, spectrum in zip(sizes, seam.axes_dims, spectra):
        pos = torch.arange(n, dtype=freqs_dtype)[:, None]  # on the CPU, as the stock buffers were built
        cos, sin = cos_sin_repeated(pos, [spectrum], [dim], seam.theta, freqs_dtype)
        cos_axes.append(cos.to(device=probe.device, dtype=probe.dtype))
        sin_axes.append(sin.to(device=probe.device, dtype=probe.dtype))
    return _expand(cos_axes, sizes), _expand(sin_axes, sizes)


def latent_patch_grid_3d(seam, hidden_states: torch.Tensor) -> tuple[int, int, int]:
    """``(frames, rows, cols)`` tokens of ``hidden_states [B, C, F, H, W]`` for the stock ``patch_size (t, h, w)``."""
    check_latents(hidden_states, "[B, C, F, H, W]")
    p_t, p_h, p_w = seam.stock[0].patch_size
    frames, height, width = hidden_states.shape[2:]
    return frames // p_t, height // p_h, width // p_w


def _expand(tables, sizes) -> torch.Tensor:
    """Per-axis ``[n_a, d_a]`` tables -> ``[1, F * H * W, 1, sum d_a]`` (time slowest, then rows, then columns)."""
    f, h, w = sizes
    grids = [
        tables[0].view(f, 1, 1, -1).expand(f, h, w, -1),
        tables[1].view(1, h, 1, -1).expand(f, h, w, -1),
        tables[2].view(1, 1, w, -1).expand(f, h, w, -1),
    ]
    return torch.cat(grids, dim=-1).reshape(1, f * h * w, 1, -1)


SKYREELS_V2 = register_family(
    Family(
        name="skyreels_v2",
        classes=("diffusers.models.transformers.transformer_skyreels_v2:SkyReelsV2Transformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=_axes_dims,
        native_theta=lambda model: 10000.0,  # SkyReelsV2RotaryPosEmbed's default; the model never passes another
        image_axes=(1, 2),
        time_axis=0,
        tables=skyreels_tables,
        cast_probe="freqs_cos",  # the tables follow the stock buffers' casts
        timestep_per_sigma=1000.0,  # the pipelines pass the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", 1),
        pipelines=(
            "SkyReelsV2Pipeline",
            "SkyReelsV2ImageToVideoPipeline",
            "SkyReelsV2DiffusionForcingPipeline",
            "SkyReelsV2DiffusionForcingImageToVideoPipeline",
            "SkyReelsV2DiffusionForcingVideoToVideoPipeline",
        ),
        train_size=720,  # 540p (960 x 544 ~ 723 x 723; the 720p models: 1280 x 720 ~ 960 x 960)
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="precomputed buffers replaced by tables from positions; per-frame timesteps (diffusion forcing)",
        attention_modules=lambda model: [(f"blocks.{i}.attn1", b.attn1) for i, b in enumerate(model.blocks)],
        latent_grid=latent_video_grid,
        camera=CameraSite(),
    )
)
