"""Helios (``HeliosTransformer3DModel``; autoregressive long video with a multi-term memory): ``HeliosRotaryPosEmbed``.

The model calls ``rope(frame_indices, height, width, device)`` up to four times per forward: for the noisy chunk
(``indices_hidden_states``) and for the short, mid and long history (``indices_latents_history_*``, at the short
history's patch grid; the model then averages the mid and long tables down by 2 and 4). Each call gives ``[B, 2
(DT + DY + DX), T, H, W]`` float32: ``einsum("d,bthw->dbthw", freqs_base_a, grid_a)`` per axis (``freqs_base`` the
``theta ** (-2i / d)`` ladder as float32 buffers, which follow the model's casts), pairs repeated, ``[cos t, cos y,
cos x, sin t, sin y, sin x]`` on dim 1. Frame indices count latent frames over the whole window (history, then the
chunk), rows and columns patches from 0.

One spectrum per forward for all four tables (history and chunk attend to each other): a schedule reads the
forward's extents before it runs (time: the span of every frame index passed, rows and columns: the chunk's patch
grid) and sets them as the step's extents; a direct call of the seam uses its own indices and grid. RIFLEx or NTK on
time (``model_extrapolation(..., time=...)``) is the natural knob for a longer window.

Context parallelism (diffusers' plan splits the attention inputs, rotary tables included, per layer) is not
verified: refused by name.
"""

from __future__ import annotations

import torch

from . import register_family
from .base import CastFollowingSeam, Family, SpectrumSeam
from .codecs import forward_arg, ladder

# forward arguments: (frame indices, their latents) with their positions in the signature; the chunk's latents are
# the hidden_states themselves
INDEX_ARGS = (
    (("indices_hidden_states", 3), ("hidden_states", 0)),
    (("indices_latents_history_short", 4), ("latents_history_short", 7)),
    (("indices_latents_history_mid", 5), ("latents_history_mid", 8)),
    (("indices_latents_history_long", 6), ("latents_history_long", 9)),
)


def _stock(model):
    rope = model.rope
    return rope.stock[0] if isinstance(rope, SpectrumSeam) else rope


def _axes_dims(model):
    rope = _stock(model)
    return (int(rope.DT), int(rope.DY), int(rope.DX))


def helios_tables(seam, frame_indices: torch.Tensor, height: int, width: int, device) -> torch.Tensor:
    """The stock table ``[B, 2 sum(d), T, H, W]`` float32 of ``frame_indices [B, T]`` on a ``height x width`` grid."""
    if not isinstance(frame_indices, torch.Tensor) or frame_indices.dim() != 2:
        shape = tuple(frame_indices.shape) if isinstance(frame_indices, torch.Tensor) else type(frame_indices)
        raise ValueError(f"frame_indices has shape {shape}; expected [B, T] latent frame indices")
    batch, frames = frame_indices.shape
    frame_indices = frame_indices.to(device=device, dtype=torch.float32)
    rows = torch.arange(height, device=device, dtype=torch.float32)
    cols = torch.arange(width, device=device, dtype=torch.float32)
    grid_y, grid_x = torch.meshgrid(rows, cols, indexing="ij")
    grids = (
        frame_indices[:, :, None, None].expand(batch, frames, height, width),
        grid_y[None, None].expand(batch, frames, -1, -1),
        grid_x[None, None].expand(batch, frames, -1, -1),
    )
    step = seam.encodings[0].step
    spectra = seam.axis_spectra(extents=lambda: step.extents or _own_extents(frame_indices, height, width))
    probe = seam.native_dtype_probe
    cos, sin = [], []
    for dim, spectrum, grid in zip(seam.axes_dims, spectra, grids):
        if spectrum.inv_freq is None:
            freqs_base = ladder(dim, seam.theta, torch.float32, device).to(probe.dtype)
        else:
            freqs_base = spectrum.inv_freq.to(device, torch.float32).to(probe.dtype)
        with torch.autocast(device_type=grid.device.type, enabled=False):
            phases = torch.einsum("d,bthw->dbthw", freqs_base, grid).repeat_interleave(2, dim=0)
        c, s = phases.cos(), phases.sin()
        if spectrum.magnitude != 1.0:
            c, s = c * spectrum.magnitude, s * spectrum.magnitude
        cos.append(c)
        sin.append(s)
    return torch.cat(cos + sin, dim=0).permute(1, 0, 2, 3, 4)


def _own_extents(frame_indices, height, width) -> list[float]:
    span = float(frame_indices.max() - frame_indices.min()) + 1.0 if frame_indices.numel() else 0.0
    return [span, float(height), float(width)]


def forward_extents(model_patch, args, kwargs) -> list[float]:
    """The forward's extents: time over every frame index passed (chunk and history), the chunk's patch grid."""
    hidden_states = forward_arg(args, kwargs, "hidden_states", 0)
    _, p_h, p_w = model_patch
    height, width = hidden_states.shape[-2] // p_h, hidden_states.shape[-1] // p_w
    indices = []
    for (name, index), (latents, position) in INDEX_ARGS:
        value = forward_arg(args, kwargs, name, index)
        if (
            isinstance(value, torch.Tensor)
            and value.numel()
            and forward_arg(args, kwargs, latents, position) is not None
        ):
            indices.append(value.reshape(-1).double())  # the model builds a table only for indices with latents
    if not indices:
        return [float(hidden_states.shape[2] // model_patch[0]), float(height), float(width)]
    everything = torch.cat(indices)
    return [float(everything.max() - everything.min()) + 1.0, float(height), float(width)]


def check_inputs(seam, args, kwargs) -> None:
    """With a schedule, set the forward's extents (module docstring) as the step's, for all four tables."""
    if seam.scheduled:
        seam.encodings[0].step.extents = forward_extents(seam.patch_size, args, kwargs)


def _make_seam(model, stock, encodings, native, coord_axes):
    (encoding,) = encodings
    seam = CastFollowingSeam(HELIOS, encoding, stock, _axes_dims(model), float(stock.theta), probe="freqs_base_t")
    seam.patch_size = tuple(int(p) for p in model.config.patch_size)
    return seam


HELIOS = register_family(
    Family(
        name="helios",
        classes=("diffusers.models.transformers.transformer_helios:HeliosTransformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=_axes_dims,
        native_theta=lambda model: float(_stock(model).theta),
        image_axes=(1, 2),
        time_axis=0,
        tables=helios_tables,
        make_seam=_make_seam,
        check_inputs=check_inputs,
        timestep_per_sigma=1000.0,  # the pipelines pass the scheduler's timesteps (1000 sigma)
        timestep_arg=("timestep", 1),
        pipelines=("HeliosPipeline", "HeliosPyramidPipeline", "HeliosModularPipeline", "HeliosPyramidModularPipeline"),
        train_size=496,  # 384 x 640
        pixels_per_token=16,  # VAE 8 x patch 2
        notes="one spectrum for the chunk and the short / mid / long history tables; time extent over the window",
    )
)
