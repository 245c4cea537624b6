"""Frequency allocation: which channel pair reads which coordinate axis at which frequency.

A :class:`RotarySpectrum` is the complete answer for a separable ("axial") rotary encoding: per pair ``p``
an axis ``axis_of_pair[p]``, an angular frequency ``inv_freq[p]`` (radians per coordinate unit) and a
magnitude ``magnitude[p]`` that multiplies cos and sin (1 for plain RoPE; YaRN's attention factor; the
band-modulation knob).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from .._validation import as_int_tuple, check_even, per_axis
from .extrapolation import make_policy


@dataclass(frozen=True, eq=False)
class RotarySpectrum:
    axis_of_pair: torch.Tensor  # [P] int64
    inv_freq: torch.Tensor  # [P] float64
    magnitude: torch.Tensor  # [P] float64
    num_axes: int

    @property
    def num_pairs(self) -> int:
        return self.inv_freq.numel()

    @property
    def rotary_dim(self) -> int:
        return 2 * self.num_pairs

    def frequency_matrix(self) -> torch.Tensor:
        """``[A, P]`` float64: the frequency each pair gives each axis (zero off its own axis)."""
        matrix = torch.zeros(self.num_axes, self.num_pairs, dtype=torch.float64)
        matrix[self.axis_of_pair, torch.arange(self.num_pairs)] = self.inv_freq
        return matrix

    def with_pair_scale(self, pair_scale: torch.Tensor | Sequence[float]) -> "RotarySpectrum":
        """Multiply each pair's magnitude by ``pair_scale`` (``[P]``)."""
        scale = torch.as_tensor(pair_scale, dtype=torch.float64).flatten()
        if scale.numel() != self.num_pairs:
            raise ValueError(
                f"pair_scale has {scale.numel()} entries; expected one per channel pair ({self.num_pairs})"
            )
        if not torch.isfinite(scale).all():
            raise ValueError("pair_scale must be finite")
        return replace(self, magnitude=self.magnitude * scale)

    def key(self) -> tuple:
        """Hashable identity used by table caches."""
        return (
            self.num_axes,
            tuple(self.axis_of_pair.tolist()),
            tuple(self.inv_freq.tolist()),
            tuple(self.magnitude.tolist()),
        )


def default_axes_dims(rotary_dim: int, num_axes: int) -> tuple[int, ...]:
    """Even split in pairs; axis 0 takes the remainder (Wan: 128 over 3 axes -> (44, 42, 42))."""
    check_even("rotary_dim", rotary_dim)
    per = 2 * (rotary_dim // (2 * num_axes))
    if per == 0:
        raise ValueError(f"rotary_dim={rotary_dim} is too small for {num_axes} axes (each needs at least 2 channels)")
    return (rotary_dim - per * (num_axes - 1),) + (per,) * (num_axes - 1)


def chunked_spectrum(
    axes_dims: Sequence[int], theta: float | Sequence[float] = 10000.0, extrapolation: object = None
) -> RotarySpectrum:
    """Each axis owns a contiguous block of pairs with its own ladder ``theta_a ** (-2i / d_a)`` (Flux, Wan, timm).

    Args:
        axes_dims: rotary channels per axis, each even (Flux ``(16, 56, 56)``).
        theta: base per axis, or one for all.
        extrapolation: policy per axis, or one for all (see :mod:`mmpos.spectrum.extrapolation`).
    """
    axes_dims = _check_axes_dims(axes_dims)
    thetas = per_axis("theta", theta, len(axes_dims))
    policies = [make_policy(p) for p in per_axis("extrapolation", extrapolation, len(axes_dims))]
    freqs, mags, axes = [], [], []
    for axis, (dim, th, policy) in enumerate(zip(axes_dims, thetas, policies)):
        f, m = policy.frequencies(dim, th)
        freqs.append(f)
        mags.append(torch.full_like(f, m))
        axes.append(torch.full((dim // 2,), axis, dtype=torch.int64))
    return RotarySpectrum(torch.cat(axes), torch.cat(freqs), torch.cat(mags), len(axes_dims))


def interleaved_spectrum(
    axes_dims: Sequence[int], theta: float | Sequence[float] = 10000.0, extrapolation: object = None
) -> RotarySpectrum:
    """One ladder over all pairs; axes take turns (Qwen3-VL MRoPE-I, generalised to any number of axes).

    Pair ``j`` belongs to axis ``a >= 1`` when ``j % A == a`` and ``j < A * n_a`` (``n_a`` = pairs of axis
    ``a``); axis 0 takes every other pair. So every axis spans the whole frequency range.
    A per-axis ``theta`` or ``extrapolation`` builds that axis' ladder over all pairs and keeps its own.
    """
    axes_dims = _check_axes_dims(axes_dims)
    num_axes, rotary_dim = len(axes_dims), sum(axes_dims)
    num_pairs = rotary_dim // 2
    axis_of_pair = torch.zeros(num_pairs, dtype=torch.int64)
    for axis in range(1, num_axes):
        pairs = axes_dims[axis] // 2
        last = axis + (pairs - 1) * num_axes
        if pairs and last >= num_pairs:
            raise ValueError(
                f"axes_dims={axes_dims}: axis {axis} needs pair index {last} in the interleaved layout but there "
                f"are only {num_pairs} pairs; give axis 0 at least as many channels as each other axis"
            )
        axis_of_pair[axis : axis + pairs * num_axes : num_axes] = axis
    thetas = per_axis("theta", theta, num_axes)
    policies = [make_policy(p) for p in per_axis("extrapolation", extrapolation, num_axes)]
    inv_freq = torch.empty(num_pairs, dtype=torch.float64)
    magnitude = torch.empty(num_pairs, dtype=torch.float64)
    for axis, (th, policy) in enumerate(zip(thetas, policies)):
        f, m = policy.frequencies(rotary_dim, th)
        mine = axis_of_pair == axis
        inv_freq[mine], magnitude[mine] = f[mine], m
    return RotarySpectrum(axis_of_pair, inv_freq, magnitude, num_axes)


ALLOCATIONS = {"chunked": chunked_spectrum, "interleaved": interleaved_spectrum}


def _check_axes_dims(axes_dims: Sequence[int]) -> tuple[int, ...]:
    dims = as_int_tuple("axes_dims", axes_dims)
    if not dims:
        raise ValueError("axes_dims must name at least one axis")
    for i, d in enumerate(dims):
        check_even(f"axes_dims[{i}]", d)
    return dims
