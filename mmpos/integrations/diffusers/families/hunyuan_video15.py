"""HunyuanVideo 1.5 (``HunyuanVideo15Transformer3DModel``; T2V and I2V): ``HunyuanVideo15RotaryPosEmbed`` on the latents.

The model calls ``rope(hidden_states)`` once per forward on the latents ``[B, C, F, H, W]`` (the pipeline's
latents, condition latents and mask concatenated on channels); the module reads only their shape: the patch grid
``(t, row, col)`` of ``(F / patch_size_t, H / patch_size, W / patch_size)`` tokens from 0, float32 ids. It returns
``(cos, sin)`` ``[S, 128]`` float32 (``get_1d_rotary_pos_embed`` with float32 phases, pairs repeated), axes
``rope_axes_dim = (16, 56, 56)``, theta 256. Only the video tokens are rotated: the text, ByT5 and image-embedding
tokens get no rotary position, so a schedule's extents are the patch grid itself (no device sync). The shared
table rebuild is :func:`latent_grid_tables`, used by HunyuanVideo 1.0 too (the same module, another class).
"""

from __future__ import annotations

import torch

from . import register_family
from .base import CameraSite, Family, latent_video_grid
from .codecs import cos_sin_repeated


def latent_patch_grid(seam, hidden_states: torch.Tensor) -> tuple[int, int, int]:
    """``(frames, rows, cols)`` tokens of ``hidden_states [B, C, F, H, W]`` as the stock module counts them
    (floor division by the stock module's ``patch_size_t`` / ``patch_size``, as the patch embedding does)."""
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 5:
        shape = tuple(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else type(hidden_states)
        raise ValueError(f"hidden_states has shape {shape}; expected latents [B, C, F, H, W]")
    stock = seam.stock[0]
    frames, height, width = hidden_states.shape[2:]
    return frames // stock.patch_size_t, height // stock.patch_size, width // stock.patch_size


def latent_grid_tables(seam, hidden_states: torch.Tensor):
    """The stock HunyuanVideo rope output ``(cos, sin)`` ``[F * H * W, sum(axes_dims)]`` float32 of the latents'
    patch grid; the schedule's extents are the grid sizes (every rotated token is an image token)."""
    return grid_tables(seam, latent_patch_grid(seam, hidden_states), hidden_states.device)


def grid_tables(seam, sizes, device, freqs_dtype: torch.dtype = torch.float32):
    """``(cos, sin)`` ``[prod(sizes), sum(axes_dims)]`` float32 of the grid ``arange(n)`` per axis (float32 ids,
    ``meshgrid`` order, phases in ``freqs_dtype``, pairs repeated); the schedule's extents are the grid sizes."""
    axes = [torch.arange(0, n, device=device, dtype=torch.float32) for n in sizes]
    pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(sizes))
    spectra = seam.axis_spectra(extents=[float(n) for n in sizes])
    return cos_sin_repeated(pos, spectra, seam.axes_dims, seam.theta, freqs_dtype=freqs_dtype)


HUNYUAN_VIDEO15 = register_family(
    Family(
        name="hunyuan_video15",
        classes=("diffusers.models.transformers.transformer_hunyuan_video15:HunyuanVideo15Transformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.rope_axes_dim),
        native_theta=lambda model: float(model.config.rope_theta),
        image_axes=(1, 2),
        time_axis=0,
        tables=latent_grid_tables,
        timestep_per_sigma=1000.0,  # the pipelines pass the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", 1),
        pipelines=("HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline"),
        train_size=640,  # the 480p model's target_size (848 x 480 ~ 640 x 640)
        pixels_per_token=16,  # 16x VAE, patch 1
        notes="video tokens only (text unrotated); grid from the latent shape",
        attention_modules=lambda model: [
            (f"transformer_blocks.{i}.attn", b.attn) for i, b in enumerate(model.transformer_blocks)
        ],
        camera=CameraSite(grid=latent_video_grid, output_index=0),  # the joint attention returns (video, text)
    )
)
