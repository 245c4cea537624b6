"""Extrapolation policies: how one axis' frequency ladder changes to run beyond the trained length.

Each policy maps ``(dim, theta)`` of one axis to ``(inv_freq [dim // 2] fp64, magnitude)``, where
``magnitude`` multiplies cos and sin (YaRN's attention factor; 1 elsewhere).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from .frequencies import rope_inv_freq


class Policy(Protocol):
    """What every extrapolation policy is: one axis' ``(inv_freq [dim // 2] fp64, magnitude)``."""

    def frequencies(self, dim: int, theta: float) -> tuple[torch.Tensor, float]: ...


@dataclass(frozen=True)
class NoExtrapolation:
    """The plain ladder."""

    def frequencies(self, dim: int, theta: float) -> tuple[torch.Tensor, float]:
        return rope_inv_freq(dim, theta), 1.0


@dataclass(frozen=True)
class PositionInterpolation:
    """Chen et al. 2023: divide every frequency by ``factor`` (positions squeezed into the trained range)."""

    factor: float

    def __post_init__(self) -> None:
        _check_factor("PositionInterpolation", self.factor)

    def frequencies(self, dim: int, theta: float) -> tuple[torch.Tensor, float]:
        return rope_inv_freq(dim, theta) / self.factor, 1.0


@dataclass(frozen=True)
class NTKAware:
    """NTK-aware scaling: ``theta *= factor ** (dim / (dim - 2))`` (high frequencies kept, low ones stretched)."""

    factor: float

    def __post_init__(self) -> None:
        _check_factor("NTKAware", self.factor)

    def frequencies(self, dim: int, theta: float) -> tuple[torch.Tensor, float]:
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
    original_length: float
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    truncate: bool = True
    clamp_low_end: bool = False  # see correction_ramp; set by DyPE, whose turn counts shrink towards 0

    def __post_init__(self) -> None:
        _check_factor("YaRN", self.factor)
        _check_positive("YaRN.original_length", self.original_length)
        _check_positive("YaRN.beta_fast", self.beta_fast)
        _check_positive("YaRN.beta_slow", self.beta_slow)
        if self.attention_factor is not None:
            _check_positive("YaRN.attention_factor", self.attention_factor)

    def frequencies(self, dim: int, theta: float) -> tuple[torch.Tensor, float]:
        extrapolated = rope_inv_freq(dim, theta)
        ramp = correction_ramp(
            dim, theta, self.original_length, self.beta_fast, self.beta_slow, self.truncate, self.clamp_low_end
        )
        keep = 1 - ramp
        inv_freq = extrapolated / self.factor * (1 - keep) + extrapolated * keep
        magnitude = self.attention_factor
        if magnitude is None:
            magnitude = yarn_attention_factor(self.factor)
        return inv_freq, float(magnitude)


@dataclass(frozen=True)
class VisionYaRN:
    """YaRN for image axes (the variant DyPE applies to FLUX): three ladders joined by two ramps.

    Pairs turning more than ``gamma[0]`` times over ``original_length`` keep the plain ladder, pairs turning
    between ``beta[0]`` and ``gamma[1]`` times take the NTK ladder (``theta * factor ** (dim / (dim - 2))``),
    pairs turning fewer than ``beta[1]`` times are interpolated (``/ factor``); linear ramps over the pair
    index join them (:func:`correction_ramp`, ends clamped at ``dim // 2`` as DyPE's code does).
    ``threshold_scale`` multiplies all four turn counts (DyPE's ``kappa(t)``: towards 0 every pair keeps the
    plain ladder). cos/sin are scaled by ``attention_factor`` (default ``0.1 ln(factor) + 1``).

    ComfyUI-DyPE's variant (``threshold_power=True``): the turn counts are raised to the power ``threshold_scale``
    instead, and the NTK ladder takes its own ``ntk_factor`` (the image's longest axis) while the interpolation
    takes ``factor`` (this axis).
    """

    factor: float
    original_length: float
    beta: tuple[float, float] = (1.25, 0.75)
    gamma: tuple[float, float] = (16.0, 2.0)
    threshold_scale: float = 1.0
    attention_factor: float | None = None
    ntk_factor: float | None = None
    threshold_power: bool = False

    def __post_init__(self) -> None:
        _check_factor("VisionYaRN", self.factor)
        _check_positive("VisionYaRN.original_length", self.original_length)
        if self.attention_factor is not None:
            _check_positive("VisionYaRN.attention_factor", self.attention_factor)
        if self.ntk_factor is not None:
            _check_factor("VisionYaRN.ntk", self.ntk_factor)
        if not (math.isfinite(self.threshold_scale) and self.threshold_scale >= 0):
            raise ValueError(f"VisionYaRN.threshold_scale must be finite and >= 0, got {self.threshold_scale!r}")
        for name in ("beta", "gamma"):
            fast, slow = getattr(self, name)
            if not fast > slow > 0:
                raise ValueError(
                    f"VisionYaRN.{name} must be (fast, slow) turn counts with fast > slow > 0, "
                    f"got {getattr(self, name)!r}"
                )

    def frequencies(self, dim: int, theta: float) -> tuple[torch.Tensor, float]:
        if dim <= 2:
            raise ValueError(f"VisionYaRN needs an axis with more than 2 rotary dims, got dim={dim}")
        plain = rope_inv_freq(dim, theta)
        magnitude = yarn_attention_factor(self.factor) if self.attention_factor is None else self.attention_factor
        if self.threshold_scale == 0 and not self.threshold_power:  # every pair turns "more than 0 times": plain
            return plain, float(magnitude)
        interpolated = plain / self.factor
        ntk, _ = NTKAware(self.factor if self.ntk_factor is None else self.ntk_factor).frequencies(dim, theta)
        scale = self.threshold_scale
        beta, gamma = self.beta, self.gamma
        if self.threshold_power:  # ComfyUI-DyPE: turn counts ** k, its ramps clamped as the reference clamps them
            beta, gamma = tuple(b**scale for b in beta), tuple(g**scale for g in gamma)
            low_part = correction_ramp(dim, theta, self.original_length, *beta, convention="dype")
            high_part = correction_ramp(dim, theta, self.original_length, *gamma, convention="dype")
            inv_freq = interpolated * low_part + ntk * (1 - low_part)
            return inv_freq * high_part + plain * (1 - high_part), float(magnitude)
        low_part = correction_ramp(
            dim,
            theta,
            self.original_length,
            beta[0] * scale,
            beta[1] * scale,
            clamp_low_end=True,
            convention="dype",
        )
        inv_freq = interpolated * low_part + ntk * (1 - low_part)
        high_part = correction_ramp(
            dim,
            theta,
            self.original_length,
            self.gamma[0] * scale,
            self.gamma[1] * scale,
            clamp_low_end=True,
            convention="dype",
        )
        return inv_freq * high_part + plain * (1 - high_part), float(magnitude)


def yarn_attention_factor(factor: float) -> float:
    """YaRN's magnitude ``0.1 ln(factor) + 1`` (1 for ``factor <= 1``)."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


RAMP_CONVENTIONS = ("transformers", "dype")


def correction_ramp(
    dim: int,
    theta: float,
    original_length: float,
    fast: float,
    slow: float,
    truncate: bool = True,
    clamp_low_end: bool = False,
    convention: str = "transformers",
) -> torch.Tensor:
    """``[dim // 2]`` fp64 ramp over the pair index: 0 for pairs turning more than ``fast`` times over
    ``original_length``, 1 for pairs turning fewer than ``slow`` times, linear in between.

    The pair index turning ``n`` times is ``dim * ln(L / (2 pi n)) / (2 ln theta)``; the range ends are rounded
    outwards (``truncate``) and clamped with ``low >= 0`` and ``high <= end``, where ``end`` is ``dim - 1`` for
    ``convention="transformers"`` (transformers' ``_compute_yarn_parameters``) and ``dim // 2``, the number of
    pairs, for ``"dype"`` (DyPE's ``get_1d_rotary_pos_embed``). ``clamp_low_end`` also keeps ``low <= end``, so
    that tiny turn counts (DyPE late in sampling) give 0 everywhere instead of the reversed range (``low > high``,
    1 everywhere) the references' clamping produces there.

    Example (``dim=16``, the ``"dype"`` end): ``low, high = 6, 9`` becomes ``6, 8``; pair 7 gets ``1/2``, not
    ``1/3``.
    """
    if convention not in RAMP_CONVENTIONS:
        raise ValueError(f"convention must be one of {RAMP_CONVENTIONS}, got {convention!r}")

    def pair_index(rotations: float) -> float:
        return dim * math.log(original_length / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    end = dim - 1 if convention == "transformers" else dim // 2
    low, high = pair_index(fast), pair_index(slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, end)
    if clamp_low_end:
        low = min(low, end)
    if low == high:
        high += 0.001
    return ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)


@dataclass(frozen=True)
class RIFLEx:
    """Zhao et al. 2025: lower the intrinsic frequency (1-based pair index ``k``) so that one period covers
    ``target_length / factor``: ``freq[k-1] = factor * 2 pi / target_length``. Use it on the time axis."""

    k: int
    target_length: int
    factor: float = 0.9

    def __post_init__(self) -> None:
        if not (isinstance(self.k, int) and self.k >= 1):
            raise ValueError(f"RIFLEx.k is a 1-based pair index, got {self.k!r}")
        _check_positive("RIFLEx.target_length", self.target_length)
        _check_factor("RIFLEx", self.factor)

    def frequencies(self, dim: int, theta: float) -> tuple[torch.Tensor, float]:
        inv_freq = rope_inv_freq(dim, theta)
        if self.k > inv_freq.numel():
            raise ValueError(f"RIFLEx.k={self.k} exceeds the {inv_freq.numel()} pairs of this axis")
        inv_freq[self.k - 1] = self.factor * 2 * math.pi / self.target_length
        return inv_freq, 1.0


def riflex_intrinsic_k(time_dim: int, theta: float, repeat_length: float) -> int:
    """RIFLEx's intrinsic frequency (1-based pair ``k``) of a ``time_dim``-channel time axis with base ``theta``:
    the pair whose period ``2 pi theta ** (2 (k - 1) / time_dim)`` is closest to ``repeat_length``, RIFLEx's
    ``N``: the (latent) frame at which the model's video first repeats when generated past its training length.

    The trained length is the usual proxy for ``N``; where the repeat is observed later, pass that: HunyuanVideo
    (16 time channels, theta 256, periods 6.3, 12.6, 25.1, 50.3, ...) trained on 33 latent frames gives ``k = 3``
    from its trained length, the authors (who observed the repeat) use ``k = 4``, i.e. ``N`` between 38 and 75.
    """
    if isinstance(time_dim, bool) or not (isinstance(time_dim, int) and time_dim >= 2):
        raise ValueError(f"time_dim must be an int >= 2 (rotary channels of the time axis), got {time_dim!r}")
    _check_positive("theta", theta)
    _check_positive("repeat_length", repeat_length)
    periods = [2 * math.pi * theta ** (2 * j / time_dim) for j in range(time_dim // 2)]
    return 1 + min(range(len(periods)), key=lambda j: abs(periods[j] - repeat_length))


POLICIES: dict[str, type[Any]] = {
    "none": NoExtrapolation,
    "pi": PositionInterpolation,
    "linear": PositionInterpolation,
    "ntk": NTKAware,
    "yarn": YaRN,
    "vision_yarn": VisionYaRN,
    "riflex": RIFLEx,
}


def make_policy(spec: object) -> Policy:
    """``None``, a policy object, or a dict like ``{"type": "yarn", "factor": 2, "original_length": 64}``."""
    if spec is None:
        return NoExtrapolation()
    if hasattr(spec, "frequencies"):
        return spec  # a policy object (duck-typed)
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


def _check_factor(name: str, factor: object) -> None:
    _check_positive(f"{name}.factor", factor)


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
