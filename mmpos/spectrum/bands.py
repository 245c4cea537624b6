"""Band law: a per-pair magnitude scale from the pair's place in its axis' frequency ladder.

Band modulation (Untwisting RoPE, arXiv 2602.05013) rescales the magnitude of some keys per rotation pair. For
pair ``d`` of a spatial axis with ``n`` pairs (``d = 0`` the highest frequency, the axis' first pair in every
mmpos allocation) the scale is

    s_d = s_hf + (s_lf - s_hf) * (d / (n - 1)) ** beta

Both channels of a pair get ``s_d``, so the scale commutes with the rotation: it is the spectrum's per-pair
``magnitude`` (:meth:`RotarySpectrum.with_pair_scale`), and a table built from :func:`band_spectrum` rotates and
scales in one step. Non-spatial axes (Flux axis 0, constant over one image) get ``s_lf`` (``axis0_mode="low"``),
the formula (``"formula"``) or 1 (``"one"``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .._validation import as_int_tuple, check_choice
from .allocation import RotarySpectrum, chunked_spectrum

AXIS0_MODES = ("low", "formula", "one")


def band_scale_per_pair(
    axis_of_pair: torch.Tensor,
    s_hf: float,
    s_lf: float,
    beta: float = 2.0,
    spatial_axes: Sequence[int] = (1, 2),
    axis0_mode: str = "low",
) -> torch.Tensor:
    """Per-pair scale ``[P]`` float64 for any allocation, given each pair's axis ``axis_of_pair`` ``[P]`` int.

    Within an axis, pairs are ranked in their order in ``axis_of_pair`` (highest frequency first).
    """
    check_choice("axis0_mode", axis0_mode, AXIS0_MODES)
    if not beta > 0:
        raise ValueError(f"beta must be positive, got {beta!r}")
    axis_of_pair = torch.as_tensor(axis_of_pair).flatten().cpu()
    num_axes = int(axis_of_pair.max()) + 1 if axis_of_pair.numel() else 0
    spatial = set(as_int_tuple("spatial_axes", spatial_axes))
    if not spatial <= set(range(num_axes)):
        raise ValueError(f"spatial_axes={sorted(spatial)} must index the spectrum's {num_axes} axes")
    scales = torch.empty(axis_of_pair.numel(), dtype=torch.float64)
    for axis in range(num_axes):
        pairs = axis_of_pair == axis
        n = int(pairs.sum())
        if n == 0:
            continue
        rel = torch.arange(n, dtype=torch.float64) / max(n - 1, 1)
        formula = s_hf + (s_lf - s_hf) * rel**beta
        if axis in spatial or axis0_mode == "formula":
            scales[pairs] = formula
        else:
            scales[pairs] = s_lf if axis0_mode == "low" else 1.0
    return scales


def band_pair_scales(
    axes_dims: Sequence[int],
    s_hf: float,
    s_lf: float,
    beta: float = 2.0,
    spatial_axes: Sequence[int] = (1, 2),
    axis0_mode: str = "low",
) -> torch.Tensor:
    """:func:`band_scale_per_pair` for the chunked layout of ``axes_dims`` (diffusers' Flux): ``[sum / 2]`` float64."""
    axis_of_pair = chunked_spectrum(as_int_tuple("axes_dims", axes_dims)).axis_of_pair
    return band_scale_per_pair(axis_of_pair, s_hf, s_lf, beta, spatial_axes, axis0_mode)


def band_channel_scales(
    axes_dims: Sequence[int],
    s_hf: float,
    s_lf: float,
    beta: float = 2.0,
    spatial_axes: Sequence[int] = (1, 2),
    axis0_mode: str = "low",
) -> torch.Tensor:
    """Per-channel ``[head_dim]`` float64: each pair's scale on both of its (adjacent) channels."""
    return band_pair_scales(axes_dims, s_hf, s_lf, beta, spatial_axes, axis0_mode).repeat_interleave(2)


def band_spectrum(
    spectrum: RotarySpectrum,
    s_hf: float,
    s_lf: float,
    beta: float = 2.0,
    spatial_axes: Sequence[int] = (1, 2),
    axis0_mode: str = "low",
) -> RotarySpectrum:
    """``spectrum`` with the band law multiplied into its per-pair magnitude."""
    scale = band_scale_per_pair(spectrum.axis_of_pair, s_hf, s_lf, beta, spatial_axes, axis0_mode)
    return spectrum.with_pair_scale(scale)
