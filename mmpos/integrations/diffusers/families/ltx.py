"""LTX-Video (``LTXVideoTransformer3DModel``): ``LTXVideoRotaryPosEmbed``, three axes ``(t, row, col)`` in fractional
coordinates, theta 10000, Flux-style ``(cos, sin)`` with the axes interleaved per frequency.

The model calls ``rope(hidden_states, num_frames, height, width, rope_interpolation_scale, video_coords)`` once per
forward. Each token's coordinate is ``g = index * rope_interpolation_scale[a] * patch / base`` (the pipelines pass
``(vae_t / frame_rate, vae_s, vae_s)``: time in seconds over 20, pixels over 2048), or ``video_coords / base``.
Every axis has ``F = inner_dim // 6`` float32 frequencies ``w_j = pi / 2 * theta ** linspace(0, 1, F)`` (rising)
and phase ``w_j (2 g - 1)``; channels ``[pad, (t, row, col) of w_0, of w_1, ...]``, each pair repeated, ``inner_dim
% 6`` padding channels first (cos 1, sin 0). Output ``(cos, sin)`` ``[B, S, inner_dim]`` float32.

The mapping to mmpos' per-axis ladder: ``native_axes_dims = (2F,) * 3``, ``native_theta = theta ** (F / (F - 1))``,
so the ladder ``theta ** (-i / (F - 1))`` is the stock frequencies over the highest one (pair ``i`` is
``w_{F-1-i}``). A schedule changes a pair by the ratio of its frequency to the plain ladder's, applied to the
stock frequency (PI, NTK, RIFLEx's chosen pair exact); its extent is in tokens (``num_frames, height, width``),
and lengths in its policies (YaRN's ``original_length``, RIFLEx's ``target_length``) are converted to the units in
which the ladder's first pair turns as fast as the stock's highest frequency (``2 w_{F-1} * step`` per token), so
YaRN's turn thresholds count the stock's true turns. Text has no rotary embedding.

Context parallelism (diffusers' ``_cp_plan`` splits ``hidden_states``, ``encoder_hidden_states`` and the mask at the
model's input and the rope's outputs ``0`` and ``1`` along dim 1): the seam takes the split of its outputs over
(:func:`~..context_parallel.own_output_split`) and builds the rows of this rank only, from the whole grid's extents
(``num_frames, height, width`` or ``video_coords``, which the plan leaves whole). What diffusers 0.42 cannot shard is
refused by name before the forward (:func:`check_inputs`): an ``encoder_attention_mask`` (its Ulysses attention
keeps all heads of the mask, its ring attention applies each rank's mask to every rank's keys) and per-token
timesteps (the plan does not split ``timestep``).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from diffusers.models.transformers import transformer_ltx

from ....coords.grids import grid_rows
from ....spectrum.frequencies import rope_inv_freq
from .. import context_parallel
from ..processors import PEProcessor
from . import register_family
from .base import Family, SpectrumSeam
from .wan import check_no_sharded_seam


def ltx_frequencies(count: int, theta: float, dtype: torch.dtype, device=None) -> torch.Tensor:
    """The stock ``theta ** linspace(log(1, theta), log(theta, theta), count) * pi / 2`` ``[count]`` in ``dtype``."""
    freqs = theta ** torch.linspace(math.log(1.0, theta), math.log(theta, theta), count, device=device, dtype=dtype)
    return freqs * math.pi / 2.0


class LTXSeam(SpectrumSeam):
    """A :class:`SpectrumSeam` whose schedules measure lengths in the stock frequencies' own units (see the module
    docstring). The model reads nothing of its rope but its output."""

    def axis_spectra(self, image_coords=None, extents=None, rates=None):
        """``rates[a]``: the stock's phase per token of axis ``a``'s highest frequency (``None``: the base seam)."""
        (encoding,) = self.encodings
        schedule = encoding.schedule
        if schedule is None or rates is None:
            return super().axis_spectra(image_coords, extents)
        key = tuple(
            _in_units(policy, rate) for policy, rate in zip(schedule.policies(extents, encoding.step.sigma), rates)
        )
        return self.split_once(key, schedule.spectrum(key))


def _in_units(policy, rate: float):
    """``policy`` with its lengths (tokens) in units where the ladder's first pair turns ``rate`` rad per token."""
    changes = {
        name: getattr(policy, name) * rate for name in ("original_length", "target_length") if hasattr(policy, name)
    }
    return dataclasses.replace(policy, **changes) if changes else policy


def _make_seam(model, stock, encodings, native, coord_axes):
    (encoding,) = encodings
    return LTXSeam(LTX, encoding, stock, _axes_dims(model), _theta(model))


def _count(model_or_rope) -> int:
    rope = getattr(model_or_rope, "rope", model_or_rope)
    rope = rope.stock[0] if isinstance(rope, SpectrumSeam) else rope
    return int(rope.dim) // 6


def _axes_dims(model):
    return (2 * _count(model),) * 3


def _theta(model):
    rope = model.rope.stock[0] if isinstance(model.rope, SpectrumSeam) else model.rope
    count = _count(rope)
    if count < 2:
        raise ValueError(f"LTX rope dim {rope.dim}: needs at least 2 frequencies per axis (dim >= 12)")
    return float(rope.theta) ** (count / (count - 1))


def _grid(rope, batch, num_frames, height, width, scale, video_coords, device, rows=None):
    """The stock fractional coordinates ``[B, S, 3]`` float32 (``rows``: only rows ``start:stop``, built without the
    others), the token extents and the grid step per token (both of the whole grid)."""
    bases = (rope.base_num_frames, rope.base_height, rope.base_width)
    if video_coords is not None:
        counts, steps = [], []
        for a in range(3):
            values = torch.unique(video_coords[0, a].double())
            counts.append(float(values.numel()))
            steps.append(float((values[1:] - values[:-1]).min()) / bases[a] if values.numel() > 1 else 1.0)
        part = video_coords if rows is None else video_coords[:, :, rows[0] : rows[1]]
        return torch.stack([part[:, a] / bases[a] for a in range(3)], dim=-1), counts, steps
    patches = (rope.patch_size_t, rope.patch_size, rope.patch_size)
    if rows is None:
        grid = rope._prepare_video_coords(batch, num_frames, height, width, scale, device)
    else:  # the stock arithmetic of `_prepare_video_coords`, on this rank's rows
        grid = grid_rows((num_frames, height, width), *rows, device=device).T.unsqueeze(0).repeat(batch, 1, 1)
        if scale is not None:
            for a in range(3):
                grid[:, a : a + 1] = grid[:, a : a + 1] * scale[a] * patches[a] / bases[a]
        grid = grid.transpose(1, 2)
    steps = [float(scale[a]) * patches[a] / bases[a] for a in range(3)] if scale is not None else [1.0] * 3
    return grid, [float(num_frames), float(height), float(width)], steps


def own_rows(seam, hidden_states, num_frames, height, width, video_coords):
    """This rank's rows ``(start, stop)`` of the token grid under diffusers' context-parallel plan (the seam splits
    its outputs itself), ``None`` in one process."""
    hook = context_parallel.own_output_split(seam, "rope")
    if hook is None:
        return None
    total = video_coords.shape[-1] if video_coords is not None else num_frames * height * width
    start, stop = context_parallel.own_rows(hook, total)
    if stop - start != hidden_states.shape[1]:
        raise ValueError(
            f"hidden_states has {hidden_states.shape[1]} tokens on this rank, the plan gives it rows {start}:{stop} "
            f"of the {total} of the grid (num_frames * height * width or video_coords)"
        )
    return start, stop


def ltx_tables(
    seam, hidden_states, num_frames=None, height=None, width=None, rope_interpolation_scale=None, video_coords=None
):
    """The stock ``(cos, sin)`` ``[B, S, inner_dim]`` float32 from the per-axis spectra (module docstring)."""
    rope = seam.stock[0]
    if video_coords is None and None in (num_frames, height, width):
        raise ValueError("LTX rope: pass num_frames, height and width (latent tokens per axis) or video_coords")
    device = hidden_states.device
    rows = own_rows(seam, hidden_states, num_frames, height, width, video_coords)
    grid, extents, steps = _grid(
        rope, hidden_states.size(0), num_frames, height, width, rope_interpolation_scale, video_coords, device, rows
    )
    count = seam.axes_dims[0] // 2
    top = float(rope.theta) * math.pi / 2.0
    spectra = seam.axis_spectra(extents=extents, rates=[2.0 * top * step for step in steps])
    stock = ltx_frequencies(count, rope.theta, torch.float32, device)
    rows, magnitudes = [], []
    for spectrum in spectra:
        if spectrum.inv_freq is None:
            rows.append(stock)
        else:
            inv = spectrum.inv_freq.to(device, torch.float64)
            ratio = (inv / rope_inv_freq(2 * count, seam.theta).to(device)).flip(0)  # per stock frequency, rising
            rows.append((ltx_frequencies(count, rope.theta, torch.float64, device) * ratio).float())
        magnitudes.append(spectrum.magnitude)
    freqs = torch.stack(rows)  # [3, F]: the stock's one ladder broadcast over the axes, per axis here
    freqs = freqs * (grid.unsqueeze(-1) * 2 - 1)  # [B, S, 3, F]
    cos, sin = freqs.cos(), freqs.sin()
    if any(m != 1.0 for m in magnitudes):
        scale = torch.tensor(magnitudes, dtype=cos.dtype, device=device)[:, None]
        cos, sin = cos * scale, sin * scale
    cos = cos.transpose(-1, -2).flatten(2).repeat_interleave(2, dim=-1)
    sin = sin.transpose(-1, -2).flatten(2).repeat_interleave(2, dim=-1)
    pad = rope.dim % 6
    if pad:
        cos = torch.cat([torch.ones_like(cos[:, :, :pad]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(cos[:, :, :pad]), sin], dim=-1)
    return cos, sin


def check_inputs(seam, args, kwargs) -> None:
    """Under diffusers' context parallelism, refuse by name what its LTX plan cannot shard (module docstring)."""
    hook = context_parallel.split_hook(seam, "rope")
    if hook is None:
        return
    mask = kwargs.get("encoder_attention_mask", args[3] if len(args) > 3 else None)
    if mask is not None:
        raise RuntimeError(
            "LTX-Video under diffusers' context parallelism: encoder_attention_mask is not supported (diffusers' "
            "Ulysses attention keeps all heads of the mask, its ring attention applies each rank's mask to every "
            "rank's keys); pass encoder_attention_mask=None (an unpadded prompt)"
        )
    timestep = kwargs.get("timestep", args[2] if len(args) > 2 else None)
    if isinstance(timestep, torch.Tensor) and timestep.dim() >= 2 and timestep[0].numel() > 1:
        raise RuntimeError(
            "LTX-Video under diffusers' context parallelism: per-token timesteps (the image-to-video and "
            f"condition pipelines', shape {tuple(timestep.shape)}) are not supported: the plan does not split "
            "`timestep`; pass one timestep per sample"
        )


def ltx_stock_rotation(query, key, rotary_emb, layer):
    return transformer_ltx.apply_rotary_emb(query, rotary_emb), transformer_ltx.apply_rotary_emb(key, rotary_emb)


class LTXRuleAttnProcessor(PEProcessor):
    """``LTXVideoAttnProcessor`` (diffusers 0.42) with its self-attention through :meth:`PEProcessor._attend` (where
    an attention rule applies); the stock arithmetic otherwise."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        video = encoder_hidden_states is None
        batch_size, sequence_length, _ = (hidden_states if video else encoder_hidden_states).shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        context = hidden_states if video else encoder_hidden_states
        query, key, value = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        query, key = attn.norm_q(query), attn.norm_k(key)
        if image_rotary_emb is not None:
            query, key = self.rotation(query, key, image_rotary_emb, self.layer)
        query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
        hidden_states = self._attend(query, key, value, attention_mask, self._parallel_config, video=video)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        return attn.to_out[1](attn.to_out[0](hidden_states))


def _rule_processor(stock, layer: int) -> LTXRuleAttnProcessor:
    backend, parallel = getattr(stock, "_attention_backend", None), getattr(stock, "_parallel_config", None)
    return LTXRuleAttnProcessor(ltx_stock_rotation, layer, backend, parallel)


def _self_attention(model) -> list:
    return [(f"transformer_blocks.{i}.attn1", block.attn1) for i, block in enumerate(model.transformer_blocks)]


def _latent_grid(model, args, kwargs) -> tuple[int, int, int]:
    names = ("num_frames", "height", "width")
    grid = tuple(kwargs.get(name, args[4 + i] if len(args) > 4 + i else None) for i, name in enumerate(names))
    if None in grid:
        raise ValueError("an attention rule on LTX needs num_frames, height and width (latent tokens per axis)")
    return tuple(int(n) for n in grid)


LTX = register_family(
    Family(
        name="ltx",
        classes=("diffusers.models.transformers.transformer_ltx:LTXVideoTransformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=_axes_dims,
        native_theta=_theta,
        image_axes=(1, 2),
        time_axis=0,
        tables=ltx_tables,
        make_seam=_make_seam,
        check_model=check_no_sharded_seam,
        check_inputs=check_inputs,
        timestep_per_sigma=1000.0,  # the pipelines pass the scheduler's timesteps (1000 sigma); I2V per-token ones
        timestep_arg=("timestep", 2),
        context_parallel=True,  # tests/integrations/test_context_parallel.py (no text mask, one timestep per sample)
        pipelines=("LTXPipeline", "LTXImageToVideoPipeline", "LTXConditionPipeline"),
        train_size=512,
        pixels_per_token=32,  # VAE 32 x patch 1
        notes="fractional coordinates (pixels / 2048, seconds / 20); interleaved axes; YaRN lengths in stock units",
        attention_modules=_self_attention,
        latent_grid=_latent_grid,
        rule_processor=_rule_processor,
    )
)
