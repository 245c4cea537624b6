"""Table formats several families share: each rebuilds a stock rotary table from per-axis frequencies.

Every function takes the positions as the stock module holds them and one :class:`~.base.AxisSpectrum` per axis;
an axis whose spectrum is the stock one gets the stock ladder computed with the stock expression (so the result
is the stock table bit for bit), any other axis mmpos' float64 frequencies rounded to the stock dtype.

    pair layout of ``cos_sin_repeated`` (Flux, HunyuanVideo, CogView): [c0 c0 c1 c1 ...] per axis, axes in order
    ``complex_pairs`` (Wan, Qwen-Image, Lumina): [e^{i p0} e^{i p1} ...] per axis, axes in order
    ``rotation_matrices`` (HiDream, Kandinsky 6): [[c0 -s0] [s0 c0]] [[c1 -s1] [s1 c1]] ... per pair
"""
from __future__ import annotations

from typing import Sequence

import torch

from .base import AxisSpectrum


def ladder(dim: int, theta: float, dtype: torch.dtype, device=None) -> torch.Tensor:
    """``get_1d_rotary_pos_embed``'s frequencies ``1 / theta ** (2i / dim)`` ``[dim / 2]`` in ``dtype``."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype, device=device)[: dim // 2] / dim))


def axis_frequencies(spectrum: AxisSpectrum, dim: int, theta: float, dtype: torch.dtype, device=None,
                     stock_ladder=ladder) -> torch.Tensor:
    """The stock ladder (``stock_ladder(dim, theta, dtype, device)``) or ``spectrum.inv_freq`` in ``dtype``."""
    if spectrum.inv_freq is None:
        return stock_ladder(dim, theta, dtype, device)
    return spectrum.inv_freq.to(device=device, dtype=dtype)


def _scaled(x: torch.Tensor, magnitude: float) -> torch.Tensor:
    return x if magnitude == 1.0 else x * magnitude


def cos_sin_repeated(pos: torch.Tensor, spectra: Sequence[AxisSpectrum], axes_dims: Sequence[int], theta: float,
                     freqs_dtype: torch.dtype = torch.float64, stock_ladder=ladder):
    """Flux-style ``(cos, sin)`` ``[S, D]`` float32, each pair's value repeated (``repeat_interleave_real``), axes
    concatenated: ``get_1d_rotary_pos_embed(d, pos[:, a], theta, use_real=True, repeat_interleave_real=True)``
    per axis. ``pos``: ``[S, A]`` (float32 as the stock modules read ids)."""
    cos_out, sin_out = [], []
    for axis, (dim, spectrum) in enumerate(zip(axes_dims, spectra)):
        freqs = axis_frequencies(spectrum, dim, theta, freqs_dtype, pos.device, stock_ladder)
        phases = torch.outer(pos[:, axis], freqs)
        cos_out.append(_scaled(phases.cos(), spectrum.magnitude).repeat_interleave(2, dim=1).float())
        sin_out.append(_scaled(phases.sin(), spectrum.magnitude).repeat_interleave(2, dim=1).float())
    return torch.cat(cos_out, dim=-1), torch.cat(sin_out, dim=-1)


def complex_pairs(pos: torch.Tensor, spectra: Sequence[AxisSpectrum], axes_dims: Sequence[int], theta: float,
                  freqs_dtype: torch.dtype = torch.float64, stock_ladder=ladder) -> torch.Tensor:
    """Complex ``[S, D / 2]`` tables ``polar(1, pos * inv_freq)`` per axis, concatenated (the stock modules'
    ``torch.polar(torch.ones_like(freqs), freqs)``), complex64 for float32 phases, complex128 for float64."""
    out = []
    for axis, (dim, spectrum) in enumerate(zip(axes_dims, spectra)):
        freqs = axis_frequencies(spectrum, dim, theta, freqs_dtype, pos.device, stock_ladder)
        phases = torch.outer(pos[:, axis].to(freqs_dtype), freqs)
        out.append(torch.polar(_scaled(torch.ones_like(phases), spectrum.magnitude), phases))
    return torch.cat(out, dim=-1)


def rotation_matrices(cos: torch.Tensor, sin: torch.Tensor, magnitude: float = 1.0) -> torch.Tensor:
    """``[..., P]`` cos and sin -> ``[..., P, 2, 2]`` rotation matrices ``[[cos, -sin], [sin, cos]]`` per pair, scaled
    by ``magnitude`` (HiDream, Kandinsky 6: the processors compute ``out = R @ (x0, x1)``)."""
    cos, sin = _scaled(cos, magnitude), _scaled(sin, magnitude)
    return torch.stack([cos, -sin, sin, cos], dim=-1).unflatten(-1, (2, 2))
