"""Extrapolation policies: how one axis' frequency ladder changes to run beyond the trained length.

Each policy maps ``(dim, theta)`` of one axis to ``(inv_freq [dim // 2] fp64, magnitude)``, where
``magnitude`` multiplies cos and sin (YaRN's attention factor; 1 elsewhere).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .frequencies import rope_inv_freq


@dataclass(frozen=True)
class NoExtrapolation:
    """The plain ladder."""

    def frequencies(self, dim: int, theta: float) -> tuple[torch.Tensor, float]:
        return rope_inv_freq(dim, theta), 1.0


@dataclass(frozen=True)
class PositionInterpolation:
    """Chen et al. 2023: divide every frequency by ``factor`` (positions squeezed into the trained range)."""

    factor: float

    def __post_init__(self):
        _check_factor("PositionInterpolation", self.factor)

    def frequencies(self, dim, theta):
        return rope_inv_freq(dim, theta) / self.factor, 1.0


@dataclass(frozen=True)
class NTKAware:
    """NTK-aware scaling: ``theta *= factor ** (dim / (dim - 2))`` (high frequencies kept, low ones stretched)."""

    factor: float

    def __post_init__(self):
        _check_factor("NTKAware", self.factor)

    def frequencies(self, dim, theta):
        if dim <= 2:
            raise ValueError(f"NTKAware needs an axis with more than 2 rotary dims, got dim={dim}")
        return rope_inv_freq(dim, theta * self.factor ** (dim / (dim - 2))), 1.0


@dataclass(frozen=True)
class YaRN:
    """Peng et al. 2023 ("by-parts" interpolation), as in transformers' ``_compute_yarn_parameters``.

    Pairs that turn more than ``beta_fast`` times over ``original_length`` keep their frequency, pairs that
    turn fewer than ``beta_slow`` times are interpolated by ``factor``, a linear ramp joins them;
    cos/sin are scaled by ``attention_factor`` (default ``0.1 ln(factor) + 1``).
    """

    factor: float
    original_length: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self):
        _check_factor("YaRN", self.factor)
        if not self.original_length > 0:
            raise ValueError(f"YaRN.original_length must be positive, got {self.original_length!r}")

    def frequencies(self, dim, theta):
        extrapolated = rope_inv_freq(dim, theta)
        interpolated = extrapolated / self.factor
        low, high = self._correction_range(dim, theta)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp
        inv_freq = interpolated * (1 - keep) + extrapolated * keep
        magnitude = self.attention_factor
        if magnitude is None:
            magnitude = 1.0 if self.factor <= 1 else 0.1 * math.log(self.factor) + 1.0
        return inv_freq, float(magnitude)

    def _correction_range(self, dim, theta):
        def pair_index(rotations):
            return dim * math.log(self.original_length / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        low, high = pair_index(self.beta_fast), pair_index(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, dim - 1)


@dataclass(frozen=True)
class RIFLEx:
    """Zhao et al. 2025: lower the intrinsic frequency (1-based pair index ``k``) so that one period covers
    ``target_length / factor``: ``freq[k-1] = factor * 2 pi / target_length``. Use it on the time axis."""

    k: int
    target_length: int
    factor: float = 0.9

    def __post_init__(self):
        if not (isinstance(self.k, int) and self.k >= 1):
            raise ValueError(f"RIFLEx.k is a 1-based pair index, got {self.k!r}")
        if not self.target_length > 0:
            raise ValueError(f"RIFLEx.target_length must be positive, got {self.target_length!r}")

    def frequencies(self, dim, theta):
        inv_freq = rope_inv_freq(dim, theta)
        if self.k > inv_freq.numel():
            raise ValueError(f"RIFLEx.k={self.k} exceeds the {inv_freq.numel()} pairs of this axis")
        inv_freq[self.k - 1] = self.factor * 2 * math.pi / self.target_length
        return inv_freq, 1.0


POLICIES = {
    "none": NoExtrapolation,
    "pi": PositionInterpolation,
    "linear": PositionInterpolation,
    "ntk": NTKAware,
    "yarn": YaRN,
    "riflex": RIFLEx,
}


def make_policy(spec):
    """``None``, a policy object, or a dict like ``{"type": "yarn", "factor": 2, "original_length": 64}``."""
    if spec is None:
        return NoExtrapolation()
    if hasattr(spec, "frequencies"):
        return spec
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict) or "type" not in spec:
        raise TypeError(f"extrapolation must be None, a policy object or a dict with a 'type' key, got {spec!r}")
    kind = spec["type"]
    if kind not in POLICIES:
        raise ValueError(f"extrapolation type {kind!r} is unknown; expected one of {sorted(POLICIES)}")
    args = {k: v for k, v in spec.items() if k != "type"}
    try:
        return POLICIES[kind](**args)
    except TypeError as err:
        raise TypeError(f"extrapolation {kind!r}: {err}") from None


def _check_factor(name, factor):
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
        raise ValueError(f"{name}.factor must be a positive finite number, got {factor!r}")
