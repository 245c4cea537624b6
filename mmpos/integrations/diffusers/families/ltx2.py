"""LTX-2 (``LTX2VideoTransformer3DModel``; LTX-2 / 2.3, audio and video): four ``LTX2AudioVideoRotaryPosEmbed``.

The model builds four tables once per forward, each from patch coordinates ``[B, A, S, 2]`` (``[start, end)`` bounds,
their midpoint is the position; or ``[B, A, S]``): ``rope`` (video self-attention, ``A = 3``: seconds, pixel rows,
pixel columns), ``audio_rope`` (audio self-attention, ``A = 1``: seconds), and the cross-modal ``cross_attn_rope``
/ ``cross_attn_audio_rope`` (the time axis of each, at ``audio_cross_attention_dim``). Each is LTX-Video's
fractional-coordinate rotary embedding: ``g = position / base`` per axis, ``F = dim // (2 A)`` frequencies
``w_j = pi / 2 * theta ** linspace(0, 1, F)`` (float64 powers with ``rope_double_precision``, then float32), phase
``w_j (2 g - 1)``, the axes interleaved per frequency. ``rope_type="interleaved"``: ``(cos, sin)`` ``[B, S, dim]``,
each pair repeated, ``dim % (2 A)`` padding channels first (cos 1, sin 0); ``"split"``: ``[B, heads, S, dim / (2
heads)]``, ``dim / 2 - A F`` padding pairs first, then the pairs reshaped per head.

Axes of the family: ``(t, row, col, audio)``: the video table's three and the audio table's one, each with its own
ladder mapped as in the ``ltx`` family (``2 F`` channels, ``theta ** (F / (F - 1))``: a schedule changes a stock
frequency by its pair's ratio to the plain ladder, lengths in the stock frequencies' units). The video table is
the seam at ``rope``; the audio table its companion at ``audio_rope`` (:attr:`~.base.Family.companion_attrs`).
The cross-modal tables stay the stock modules: they align audio with video time on a shared scale, which a change
of one side's spectrum would break; extrapolation there is not offered. Schedules measure extents in tokens
(distinct positions per axis, from the coordinates: one device sync, only with a schedule).

Context parallelism: diffusers 0.42.1's ``_cp_plan`` splits the video tokens, the text and the ``rope`` tables but
leaves the audio-video cross-attention's video table (``cross_attn_rope``) whole, so a forward under it fails (and
it asks for ``encoder_attention_mask``, which Ulysses cannot take split). :func:`ltx2_context_parallel_plan` is
that plan with ``cross_attn_rope`` split as ``rope`` and the text mask left out: the stock model (the audio whole on
every rank: its attention over the duplicated audio keys is the one-process attention) and a ``plucker`` camera
adapter on it equal one process (``tests/integrations/test_context_parallel_camera.py``). ``set_pe`` (the seam) is
not verified under any plan: a forward with it under ``enable_parallelism`` is refused by name; so is a camera
adapter under another plan or with inputs the plan does not shard (:func:`check_camera_context_parallel`).
"""

from __future__ import annotations

import copy
import inspect
import math

import diffusers
import torch
from torch import nn

from ....spectrum.allocation import chunked_spectrum
from ....spectrum.frequencies import rope_inv_freq
from ..context_parallel import split_hook
from . import register_family
from .base import CameraSite, Family, ids_values_key
from .ltx import LTXSeam

VIDEO_AXES = 3


def ltx2_frequencies(count: int, theta: float, dtype: torch.dtype, device=None) -> torch.Tensor:
    """The stock ``theta ** linspace(0, 1, count) * pi / 2`` ``[count]`` computed in ``dtype`` (the stock module:
    float64 with ``double_precision``, else float32; then cast to float32)."""
    powers = torch.pow(theta, torch.linspace(start=0.0, end=1.0, steps=count, dtype=dtype, device=device))
    return powers * torch.pi / 2.0


def _stock(module):
    return module.stock[0] if hasattr(module, "stock") else module


def _counts(model) -> tuple[int, int]:
    video, audio = _stock(model.rope), _stock(model.audio_rope)
    return int(video.dim) // (2 * VIDEO_AXES), int(audio.dim) // 2


def _axes_dims(model):
    video, audio = _counts(model)
    return (2 * video,) * VIDEO_AXES + (2 * audio,)


def _theta(model):
    thetas = []
    for count in _counts(model):
        if count < 2:
            raise ValueError(
                f"LTX-2 rope: needs at least 2 frequencies per axis, got {count} (dims {_axes_dims(model)})"
            )
        thetas.append(float(_stock(model.rope).theta) ** (count / (count - 1)))
    return (thetas[0],) * VIDEO_AXES + (thetas[1],)


def midpoints(coords: torch.Tensor) -> torch.Tensor:
    """Patch positions ``[B, A, S]``: the midpoints of ``[start, end)`` bounds ``[B, A, S, 2]`` (the stock arithmetic),
    or ``coords`` as given."""
    if coords.ndim == 4:
        start, end = coords.chunk(2, dim=-1)
        return ((start + end) / 2.0).squeeze(-1)
    if coords.ndim != 3:
        raise ValueError(f"LTX-2 rope coords have shape {tuple(coords.shape)}; expected [B, A, S, 2] or [B, A, S]")
    return coords


def _extents_and_steps(positions: torch.Tensor, bases) -> tuple[list[float], list[float]]:
    """Per axis of the first sample: distinct positions (tokens) and the smallest step between them over the base."""
    extents, steps = [], []
    for axis, base in enumerate(bases):
        values = torch.unique(positions[0, axis].double())
        extents.append(float(values.numel()))
        steps.append(float((values[1:] - values[:-1]).min()) / base if values.numel() > 1 else 1.0 / base)
    return extents, steps


class LTX2Seam(LTXSeam):
    """The video table (``rope``) and, through :attr:`companions`, the audio table (``audio_rope``); per-axis ladders
    (module docstring)."""

    def __init__(self, family, encoding, stock, audio_stock, axes_dims, thetas):
        super().__init__(family, encoding, stock, axes_dims, thetas[0])
        self.thetas = tuple(float(t) for t in thetas)
        self._plain = chunked_spectrum(self.axes_dims, self.thetas)
        self.companions = {"audio_rope": LTX2AudioSeam(self, audio_stock)}

    def prepare_video_coords(self, *args, **kwargs) -> torch.Tensor:
        """The stock module's patch bounds (the model asks its ``rope`` for them)."""
        return self.stock[0].prepare_video_coords(*args, **kwargs)

    def table(self, rope, axes: tuple[int, ...], coords: torch.Tensor, device=None):
        """The stock output of ``rope`` (a stock ``LTX2AudioVideoRotaryPosEmbed``) on ``coords``, its axes being the
        family's ``axes``."""
        device = device or coords.device
        positions = midpoints(coords)
        bases = (rope.base_num_frames, rope.base_height, rope.base_width)[: len(axes)]
        if positions.shape[1] != len(axes):
            raise ValueError(f"LTX-2 rope coords have {positions.shape[1]} axes; this table takes {len(axes)}")
        grid = torch.stack([positions[:, i] / bases[i] for i in range(len(axes))], dim=-1).to(device)
        count = int(rope.dim) // (2 * len(axes))
        precision = torch.float64 if rope.double_precision else torch.float32
        stock = ltx2_frequencies(count, rope.theta, precision, device).to(torch.float32)
        spectra = self._spectra(rope, axes, positions, bases)
        rows, magnitudes = [], []
        for axis, spectrum in zip(axes, spectra):
            if spectrum.inv_freq is None:
                rows.append(stock)
            else:
                inv = spectrum.inv_freq.to(device, torch.float64)
                ratio = (inv / rope_inv_freq(2 * count, self.thetas[axis]).to(device)).flip(0)  # per stock frequency
                rows.append((ltx2_frequencies(count, rope.theta, torch.float64, device) * ratio).float())
            magnitudes.append(spectrum.magnitude)
        phases = (grid.unsqueeze(-1) * 2 - 1) * torch.stack(rows)  # [B, S, A, F]
        cos, sin = phases.cos(), phases.sin()
        if any(m != 1.0 for m in magnitudes):
            scale = torch.tensor(magnitudes, dtype=cos.dtype, device=device)[:, None]
            cos, sin = cos * scale, sin * scale
        return _layout(rope, cos.transpose(-1, -2).flatten(2), sin.transpose(-1, -2).flatten(2), len(axes))

    def _spectra(self, rope, axes, positions, bases):
        def resolved():
            extents, steps = _extents_and_steps(positions, bases)
            top = float(rope.theta) * math.pi / 2.0  # the stock's highest frequency
            full_extents, rates = [0.0] * len(self.axes_dims), [1.0] * len(self.axes_dims)
            for axis, extent, step in zip(axes, extents, steps):
                full_extents[axis], rates[axis] = extent, 2.0 * top * step
            return full_extents, rates

        if self.scheduled:
            extents, rates = resolved()
            spectra = self.axis_spectra(extents=extents, rates=rates)
        else:
            spectra = self.axis_spectra()
        return [spectra[axis] for axis in axes]


def _layout(rope, cos: torch.Tensor, sin: torch.Tensor, num_axes: int):
    """Per-pair ``cos`` / ``sin`` ``[B, S, A F]`` -> the stock ``rope_type`` layout (module docstring)."""
    if rope.rope_type == "interleaved":
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        pad = rope.dim % (2 * num_axes)
    else:
        pad = rope.dim // 2 - cos.shape[-1]
    if pad:
        cos = torch.cat([torch.ones_like(cos[:, :, :pad]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(sin[:, :, :pad]), sin], dim=-1)
    if rope.rope_type == "split":
        batch, tokens = cos.shape[:2]
        cos = cos.reshape(batch, tokens, rope.num_attention_heads, -1).swapaxes(1, 2)
        sin = sin.reshape(batch, tokens, rope.num_attention_heads, -1).swapaxes(1, 2)
    return cos, sin


class LTX2AudioSeam(nn.Module):
    """The audio table (``audio_rope``) of an :class:`LTX2Seam`: its last axis."""

    def __init__(self, seam: LTX2Seam, stock):
        super().__init__()
        self.seam, self.stock = [seam], [stock]  # lists: neither is a submodule

    def prepare_audio_coords(self, *args, **kwargs) -> torch.Tensor:
        """The stock module's patch bounds (the model asks its ``audio_rope`` for them)."""
        return self.stock[0].prepare_audio_coords(*args, **kwargs)

    def forward(self, coords: torch.Tensor, device=None):
        return self.seam[0].table(self.stock[0], (VIDEO_AXES,), coords, device)


def ltx2_tables(seam: LTX2Seam, coords: torch.Tensor, device=None):
    """The stock video table ``(cos, sin)`` of ``coords`` ``[B, 3, S, 2]`` (module docstring)."""
    return seam.table(seam.stock[0], tuple(range(VIDEO_AXES)), coords, device)


def _make_seam(model, stock, encodings, native, coord_axes):
    (encoding,) = encodings
    return LTX2Seam(LTX2, encoding, stock, model.audio_rope, _axes_dims(model), _theta(model))


def packed_video_grid(model, args, kwargs) -> tuple[int, int, int]:
    """The video token grid of a forward on packed tokens ``[B, F * H * W, C]``: its ``num_frames``, ``height`` and
    ``width`` (latent sizes) in ``patch_size_t`` / ``patch_size`` steps, as the video rope counts them."""
    sizes = [kwargs.get(name) for name in ("num_frames", "height", "width")]
    if any(size is None for size in sizes):
        raise ValueError(
            "LTX-2 camera adapters read the video grid from the forward's num_frames, height and width (latent sizes), "
            "as the LTX-2 pipelines pass them; got None"
        )
    steps = (model.config.patch_size_t, model.config.patch_size, model.config.patch_size)
    return tuple(-(-int(n) // int(p)) for n, p in zip(sizes, steps))


def ltx2_context_parallel_plan() -> dict:
    """diffusers' ``LTX2VideoTransformer3DModel._cp_plan`` with ``cross_attn_rope``'s outputs ``(cos, sin)`` split
    along the tokens as ``rope``'s, and no ``encoder_attention_mask`` entry: pass it as
    ``enable_parallelism(config=..., cp_plan=ltx2_context_parallel_plan())`` (module docstring)."""
    from diffusers import LTX2VideoTransformer3DModel

    plan = copy.deepcopy(LTX2VideoTransformer3DModel._cp_plan)
    plan[""].pop("encoder_attention_mask", None)
    plan["cross_attn_rope"] = copy.deepcopy(plan["rope"])
    return plan


# inputs the plan leaves whole while they index the split video tokens (or, the text mask, the split text)
UNSHARDED_INPUTS = ("encoder_attention_mask", "video_self_attention_mask", "video_keyframes_mask")


def check_camera_context_parallel(model, args=None, kwargs=None) -> None:
    """A camera adapter on ``model`` under context parallelism: refused (one line) unless the plan splits
    ``cross_attn_rope`` (:func:`ltx2_context_parallel_plan`), the tables are interleaved, and (given a forward's
    inputs) no text mask, self-attention mask or keyframe mask and one timestep per sample are passed."""
    what = f"an LTX-2 camera adapter under diffusers' context parallelism ({type(model).__name__})"
    if split_hook(model.cross_attn_rope, "cross_attn_rope") is None:
        raise RuntimeError(
            f"{what}: the plan leaves cross_attn_rope whole while it splits the video tokens (diffusers "
            f"{diffusers.__version__}'s _cp_plan: its forward fails); pass "
            "enable_parallelism(config=..., cp_plan=ltx2_context_parallel_plan())"
        )
    if model.config.rope_type != "interleaved":
        raise RuntimeError(
            f"{what}: rope_type={model.config.rope_type!r}; the plan splits dim 1 of the tables, the tokens in the "
            "'interleaved' layout only (heads in 'split')"
        )
    if kwargs is None:
        return
    inputs = inspect.signature(type(model).forward).bind_partial(model, *args, **kwargs).arguments
    passed = [name for name in UNSHARDED_INPUTS if inputs.get(name) is not None]
    if passed:
        raise RuntimeError(f"{what}: {passed[0]} is not supported (the plan does not shard it); pass None")
    timestep = inputs.get("timestep")
    if isinstance(timestep, torch.Tensor) and timestep.dim() > 1 and timestep.shape[1] > 1:
        raise RuntimeError(f"{what}: per-token timesteps {tuple(timestep.shape)} are not supported (the plan does "
                           "not split them); pass one timestep per sample")  # fmt: skip


LTX2 = register_family(
    Family(
        name="ltx2",
        classes=("diffusers.models.transformers.transformer_ltx2:LTX2VideoTransformer3DModel",),
        position_attr="rope",
        companion_attrs=("audio_rope",),
        axis_names=("t", "row", "col", "audio"),
        native_axes_dims=_axes_dims,
        native_theta=_theta,
        image_axes=(1, 2),
        time_axis=0,
        tables=ltx2_tables,
        tables_key=ids_values_key,
        make_seam=_make_seam,
        timestep_per_sigma=1000.0,  # the pipelines pass the scheduler's timesteps (1000 sigma)
        timestep_arg=("timestep", 4),
        pipelines=(
            "LTX2Pipeline",
            "LTX2ImageToVideoPipeline",
            "LTX2ConditionPipeline",
            "LTX2InContextPipeline",
            "LTX2HDRPipeline",
            "LTX2DFRPipeline",
            "LTX2DFRTemporalRefinePipeline",
        ),
        train_size=512,
        pixels_per_token=32,  # VAE 32 x patch 1
        notes="video and audio tables (interleaved or split); cross-modal tables stock; audio axis 3",
        attention_modules=lambda model: [
            (f"transformer_blocks.{i}.attn1", b.attn1) for i, b in enumerate(model.transformer_blocks)
        ],
        latent_grid=packed_video_grid,
        # video self-attention only: audio_attn1 untouched; plucker under ltx2_context_parallel_plan()
        camera=CameraSite(context_parallel=check_camera_context_parallel),
    )
)
