"""CogVideoX 1.0 / 1.5 (``CogVideoXTransformer3DModel``) and ConsisID (``ConsisIDTransformer3DModel``): the pipeline
builds the rotary tables and passes them as ``forward(image_rotary_emb=(cos, sin))`` (:mod:`.rotary_input`).

The pipelines' ``_prepare_rotary_positional_embeddings`` call ``get_3d_rotary_pos_embed`` on the latent token grid
``(F, H / p, W / p)`` (hidden states ``[B, F, C, H, W]``): axes ``(t, row, col)`` of ``D / 4, 3 D / 8, 3 D / 8``
channels (``D`` = ``attention_head_dim``), theta 10000, a float32 ladder and float32 phases, each pair's cos / sin
repeated, ``[F H W, D]``.

* CogVideoX 1.0 and ConsisID (``patch_size_t`` unset): ``grid_type="linspace"``: time ``0 .. F - 1``; rows and
  columns are **fitted into the base grid** ``sample_height / p x sample_width / p`` (the resize-crop region of
  ``get_resize_crop_region_for_grid``, then ``linspace(start, stop (n - 1) / n, n)``): a larger grid gets
  fractional positions inside the base grid (built-in position interpolation), so a spatial extrapolation policy
  sees about the base extent and leaves rows and columns nearly as trained; time grows with the clip, which is where
  RIFLEx and the other time policies act.
* CogVideoX 1.5 (``patch_size_t`` set): ``grid_type="slice"``: integer positions ``0 .. n - 1`` on every axis, time
  over ``ceil(F / p_t)`` frames: the extrapolation policies act on all three axes.

The pipelines pass the scheduler's discrete timesteps (0 .. 999): sigma is read as ``timestep / 1000``.
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family
from .codecs import cos_sin_repeated, forward_arg
from .rotary_input import RotaryInput, fitted_positions, resize_crop_region, rotary_input_family

THETA = 10000.0


def axes_dims(model_or_config) -> tuple[int, int, int]:
    """``get_3d_rotary_pos_embed``'s split of the head: ``(D // 4, D // 8 * 3, D // 8 * 3)``."""
    config = getattr(model_or_config, "config", model_or_config)
    d = int(config.attention_head_dim)
    return (d // 4, d // 8 * 3, d // 8 * 3)


def latent_grid(config, args, kwargs) -> tuple[int, int, int]:
    """``(F, H / p, W / p)`` of the forward's hidden states ``[B, F, C, H, W]``."""
    hidden_states = forward_arg(args, kwargs, "hidden_states", 0)
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 5:
        shape = tuple(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else type(hidden_states)
        raise ValueError(f"hidden_states has shape {shape}; expected latents [B, F, C, H, W]")
    frames, _, height, width = hidden_states.shape[1:]
    p = int(config.patch_size)
    return int(frames), int(height) // p, int(width) // p


def positions(config, grid, device):
    """The per-axis positions ``get_3d_rotary_pos_embed`` computes its phases on, and the rows it keeps."""
    frames, rows, cols = grid
    p, p_t = int(config.patch_size), config.get("patch_size_t")
    base_height, base_width = int(config.sample_height) // p, int(config.sample_width) // p
    f32 = dict(device=device, dtype=torch.float32)
    if p_t is None:  # grid_type="linspace" on the resize-crop region of the base grid
        start, stop = resize_crop_region((rows, cols), base_width, base_height)
        row, col = (fitted_positions(start[a], stop[a], n, device) for a, n in enumerate((rows, cols)))
        return [fitted_positions(0, frames, frames, device), row, col], (frames, rows, cols)
    frames = (frames + int(p_t) - 1) // int(p_t)  # grid_type="slice": arange(max_size), sliced after cos / sin
    return [
        torch.arange(frames, **f32),
        torch.arange(max(base_height, rows), **f32),
        torch.arange(max(base_width, cols), **f32),
    ], (frames, rows, cols)


def tables(seam, axis_positions, counts, spectra, stock=None):
    """``get_3d_rotary_pos_embed``'s ``(cos, sin)`` ``[F H W, D]`` float32 with ``spectra`` per axis: per axis
    ``get_1d_rotary_pos_embed(d, positions, theta, use_real=True)`` (float32 ladder), rows kept, broadcast over the
    grid, axes concatenated."""
    per_axis = [
        tuple(t[:n] for t in cos_sin_repeated(p[:, None], [s], [d], seam.theta, freqs_dtype=torch.float32))
        for p, n, s, d in zip(axis_positions, counts, spectra, seam.axes_dims)
    ]
    frames, rows, cols = counts

    def combine(t, h, w):
        return torch.cat(
            [
                t[:, None, None, :].expand(-1, rows, cols, -1),
                h[None, :, None, :].expand(frames, -1, cols, -1),
                w[None, None, :, :].expand(frames, rows, -1, -1),
            ],
            dim=-1,
        ).view(frames * rows * cols, -1)

    return tuple(combine(*(axis[i] for axis in per_axis)) for i in (0, 1))


def _family(name, cls, pipelines, notes) -> Family:
    return register_family(
        rotary_input_family(
            name=name,
            classes=(cls,),
            axis_names=("t", "row", "col"),
            native_axes_dims=axes_dims,
            native_theta=lambda model: THETA,
            image_axes=(1, 2),
            time_axis=0,
            rotary_input=RotaryInput(
                grid=latent_grid,
                positions=positions,
                build=tables,
                builder="get_3d_rotary_pos_embed (the pipeline's _prepare_rotary_positional_embeddings)",
            ),
            timestep_per_sigma=1000.0,  # discrete scheduler timesteps 0 .. 999
            pipelines=pipelines,
            train_size=720,
            pixels_per_token=16,  # 8x VAE, patch 2
            notes=notes,
        )
    )


COGVIDEOX = _family(
    "cogvideox",
    "diffusers.models.transformers.cogvideox_transformer_3d:CogVideoXTransformer3DModel",
    (
        "CogVideoXPipeline",
        "CogVideoXImageToVideoPipeline",
        "CogVideoXVideoToVideoPipeline",
        "CogVideoXFunControlPipeline",
    ),
    "the pipeline builds the tables (forward(image_rotary_emb=...)): set_pe rebuilds them from the builder's "
    "positions; 1.0 fits rows and columns into its base grid (extrapolation acts on time), 1.5 has integer positions",
)
CONSISID = _family(
    "consisid",
    "diffusers.models.transformers.consisid_transformer_3d:ConsisIDTransformer3DModel",
    ("ConsisIDPipeline",),
    "CogVideoX 1.0's tables, built by the pipeline (forward(image_rotary_emb=...)): rows and columns fitted into the "
    "base grid, extrapolation acts on time",
)
