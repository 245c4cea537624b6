"""HunyuanDiT (``HunyuanDiT2DModel``): the pipeline builds the rotary tables and passes them as
``forward(image_rotary_emb=(cos, sin))`` (:mod:`.rotary_input`).

``HunyuanDiTPipeline`` (and its ControlNet and PAG variants) call ``get_2d_rotary_pos_embed(D, crops, (H / p, W / p))``
on the latent token grid (hidden states ``[B, C, H, W]``, ``D`` the head size): the grid's aspect is fitted into a
**fixed base region** of ``512 / 8 / p`` tokens a side (32 at patch 2; ``get_resize_crop_region_for_grid``) and each
axis gets ``linspace(start, stop (n - 1) / n, n)``: fractional positions in base units (built-in position
interpolation: the 1024 px training grid of 64 x 64 tokens spans 32.5 units). Channels: the first ``D / 2`` read
the column, the last ``D / 2`` the row (``meshgrid(..., indexing="xy")``), theta 10000, float32 ladder and phases,
each pair's cos / sin repeated, ``[H W, D]``.

Extrapolation presets take the training grid in those base units (``model_extrapolation(model, "ntk", (32.5,
32.5))`` for 1024 px): a larger image stays near the base extent, so they change little; ``theta`` and
``pair_scale`` act at any size. ``HunyuanDiT2DControlNetModel`` gets the pipeline's tables too and is not
reached: with a spectrum other than the training one its residuals are computed on the stock tables (``set_pe`` on
it is refused by name). The pipelines pass the scheduler's discrete timesteps (0 .. 999): sigma = timestep / 1000.
"""

from __future__ import annotations

import torch

from . import register_family
from .base import check_latents
from .codecs import cos_sin_repeated, forward_arg
from .rotary_input import RotaryInput, fitted_positions, resize_crop_region, rotary_input_family


def axes_dims(model) -> tuple[int, int]:
    """``(D / 2, D / 2)``: the column, then the row."""
    d = int(model.inner_dim) // int(model.num_heads)
    return (d // 2, d // 2)


def latent_grid(config, args, kwargs) -> tuple[int, int]:
    """``(H / p, W / p)`` of the forward's hidden states ``[B, C, H, W]``."""
    hidden_states = forward_arg(args, kwargs, "hidden_states", 0)
    check_latents(hidden_states, "[B, C, H, W]")
    p = int(config.patch_size)
    return int(hidden_states.shape[-2]) // p, int(hidden_states.shape[-1]) // p


def positions(config, grid, device):
    """Column and row positions in the base region, as the pipeline's builder computes them."""
    rows, cols = grid
    base = 512 // 8 // int(config.patch_size)
    start, stop = resize_crop_region((rows, cols), base, base)
    row, col = (fitted_positions(start[a], stop[a], n, device) for a, n in enumerate((rows, cols)))
    return [col, row], (cols, rows)


def tables(seam, axis_positions, counts, spectra, stock=None):
    """``get_2d_rotary_pos_embed``'s ``(cos, sin)`` ``[H W, D]`` float32 with ``spectra`` per axis (column, row):
    the grid in row-major order, ``get_1d_rotary_pos_embed(D / 2, ..., use_real=True)`` per axis."""
    col, row = axis_positions
    grid = torch.stack(torch.meshgrid(col, row, indexing="xy")).reshape(2, -1).T  # [H W, (col, row)]
    return cos_sin_repeated(grid, spectra, seam.axes_dims, seam.theta, freqs_dtype=torch.float32)


HUNYUANDIT = register_family(
    rotary_input_family(
        name="hunyuandit",
        classes=("diffusers.models.transformers.hunyuan_transformer_2d:HunyuanDiT2DModel",),
        axis_names=("col", "row"),
        native_axes_dims=axes_dims,
        native_theta=lambda model: 10000.0,
        image_axes=(1, 0),  # (rows, cols) of model_extrapolation: the row axis is the second
        rotary_input=RotaryInput(
            grid=latent_grid,
            positions=positions,
            build=tables,
            builder="get_2d_rotary_pos_embed (HunyuanDiTPipeline, on the 512 px base region)",
        ),
        timestep_per_sigma=1000.0,  # discrete scheduler timesteps 0 .. 999
        pipelines=("HunyuanDiTPipeline", "HunyuanDiTControlNetPipeline", "HunyuanDiTPAGPipeline"),
        train_size=1024,
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="the pipeline builds the tables (forward(image_rotary_emb=...)), fitting every grid into a fixed 512 px "
        "base region: presets take the training grid in base units; its ControlNet keeps the stock tables",
    )
)
