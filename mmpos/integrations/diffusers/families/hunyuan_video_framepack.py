"""FramePack (``HunyuanVideoFramepackTransformer3DModel``, ``HunyuanVideoFramepackPipeline``): HunyuanVideo's rope on
given frame indices, called once per token group.

``HunyuanVideoFramepackRotaryPosEmbed(frame_indices, height, width, device)`` returns ``(cos, sin)``
``[T * H * W, sum(rope_axes_dim)]`` float32 of the grid ``(frame_indices[t], row, col)`` (``height / patch_size``
rows, float32 ids and phases, pairs repeated, axes ``(16, 56, 56)``, theta 256). The model calls it for the latents
(``indices_latents``) and for each clean-latent group the pipeline passes (``indices_latents_clean``,
``indices_latents_history_2x`` / ``_4x``: the history frames' indices, at full resolution; the model pools the 2x
and 4x tables itself). One spectrum serves every call of a forward: a schedule's extents are the rows and columns
and, on the time axis, the span of every frame index the forward was given (the clean prefix at 0 through the
newest history frame), so the clean latents' ropes and the noisy latents' turn alike.
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family
from .codecs import cos_sin_repeated, forward_arg

_INDICES = (
    ("indices_latents", 6),
    ("indices_latents_clean", 9),
    ("indices_latents_history_2x", 11),
    ("indices_latents_history_4x", 13),
)


def _note_frame_indices(seam, args, kwargs) -> None:
    """Record the forward's frame-index tensors (their span is the schedule's time extent)."""
    found = [forward_arg(args, kwargs, name, index) for name, index in _INDICES]
    seam.frame_indices = [i for i in found if isinstance(i, torch.Tensor) and i.numel()]


def _frame_span(tensors) -> float:
    low = min(float(t.min()) for t in tensors)
    return max(float(t.max()) for t in tensors) - low + 1.0


def framepack_tables(seam, frame_indices: torch.Tensor, height: int, width: int, device):
    """The stock output ``(cos, sin)`` ``[T * H * W, sum(axes_dims)]`` float32 for 1D ``frame_indices [T]`` and a
    ``height x width`` latent (before patching)."""
    if not isinstance(frame_indices, torch.Tensor) or frame_indices.dim() != 1:
        shape = tuple(frame_indices.shape) if isinstance(frame_indices, torch.Tensor) else type(frame_indices)
        raise ValueError(f"frame_indices has shape {shape}; expected one index per latent frame [T]")
    patch = seam.stock[0].patch_size
    rows, cols = height // patch, width // patch
    axes = (
        frame_indices.to(device=device, dtype=torch.float32),
        torch.arange(0, rows, device=device, dtype=torch.float32),
        torch.arange(0, cols, device=device, dtype=torch.float32),
    )
    pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)
    spectra = seam.axis_spectra(
        extents=lambda: [_frame_span(getattr(seam, "frame_indices", None) or [frame_indices]), rows, cols]
    )
    return cos_sin_repeated(pos, spectra, seam.axes_dims, seam.theta, freqs_dtype=torch.float32)


HUNYUAN_VIDEO_FRAMEPACK = register_family(
    Family(
        name="hunyuan_video_framepack",
        classes=(
            "diffusers.models.transformers.transformer_hunyuan_video_framepack:HunyuanVideoFramepackTransformer3DModel",
        ),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.rope_axes_dim),
        native_theta=lambda model: float(model.config.rope_theta),
        image_axes=(1, 2),
        time_axis=0,
        tables=framepack_tables,
        check_inputs=_note_frame_indices,
        timestep_per_sigma=1000.0,  # the pipeline passes the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", 1),
        pipelines=("HunyuanVideoFramepackPipeline",),
        train_size=640,  # 640 x 640 bucket
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="one rope call per token group (latents, clean, 2x / 4x history): one spectrum per forward, time "
        "extent over every frame index",
    )
)
