"""Extrapolation schedules: the spectrum as a function of the token extent and of the diffusion time.

A static policy (:mod:`.extrapolation`) needs its factor up front. An :class:`ExtrapolationSchedule` derives it
from the extent of the coordinates along its axis (``scale = extent / original_length``; at or below the training
extent it is the plain ladder, bit for bit) and, when ``dynamic`` (DyPE, Issachar et al. 2025, arXiv 2510.20766),
from the noise level ``sigma`` of the current denoising step too::

    t = min(sigma / start_sigma, 1)          # 1 = pure noise
    kappa(t) = lambda_s * t ** lambda_t      # extrapolation strength, 0 at the clean end

    ntk           theta' = theta * scale ** (kappa * d / (d - 2))   (NTK at factor scale ** kappa)
    yarn          YaRN at factor scale, turn thresholds (beta_fast, beta_slow) * kappa
    vision_yarn   VisionYaRN at factor scale, turn thresholds (beta, gamma) * kappa

Late steps (small sigma, where high frequencies are decided) therefore see the training spectrum again, early
steps (layout, low frequencies) the full extrapolation. YaRN's magnitude ``0.1 ln(scale) + 1`` is scheduled as
``0.1 min(kappa, 1) ln(scale) + 1`` (``schedule_magnitude``; the reference code keeps it fixed).

A schedule resolves to a static policy (frozen dataclasses, equal by value): tables are cached under that value,
so they are rebuilt only when the resolved policy changes (:class:`ScheduledSpectrum`). The step's sigma is read
from a :class:`DiffusionStep` the caller sets (``set_pe``'s pre-forward hook does it from ``timestep``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

from .._per_thread import PerThread
from .._validation import check_choice, check_finite_number, per_axis
from ..ops.tables import KeyedCache
from .allocation import RotarySpectrum
from .extrapolation import (
    NoExtrapolation,
    NTKAware,
    Policy,
    PositionInterpolation,
    VisionYaRN,
    YaRN,
    make_policy,
    yarn_attention_factor,
)

METHODS = ("pi", "ntk", "yarn", "vision_yarn")
DYNAMIC_METHODS = ("ntk", "yarn", "vision_yarn")
DEFAULT_LAMBDA_S = {"ntk": 2.0, "yarn": 1.0, "vision_yarn": 1.0}  # the reference code's values
CONVENTIONS = ("authors", "comfyui")  # the DyPE authors' code; ComfyUI-DyPE's port
COMFYUI_METHODS = ("vision_yarn", "yarn", "ntk")
COMFYUI_LAMBDA_S = 2.0  # ComfyUI-DyPE's dype_scale default


class DiffusionStep:
    """The explicit step context a scheduled encoding reads: ``sigma`` in [0, 1] (1 = pure noise), or ``None``
    outside sampling; ``extents`` per axis when the scale must come from other tokens than the table's (Qwen-Image:
    the images', also for the text table; a context-parallel shard: the whole sequence's), else ``None`` (the
    coordinates' own extent).

    Both are per thread (:class:`~mmpos._per_thread.PerThread`): one encoding serves concurrent calls at
    different steps; a thread that set nothing reads the latest values any thread set."""

    def __init__(self, sigma: float | None = None, extents: list | None = None):
        self._sigma, self._extents = PerThread(sigma), PerThread(extents)

    sigma = property(lambda self: self._sigma.get(), lambda self, value: self._sigma.set(value))
    extents = property(lambda self: self._extents.get(), lambda self, value: self._extents.set(value))

    def swap_extents(self, extents: list | None) -> object:
        """``extents`` in this thread only, until :meth:`restore_extents` with the returned state."""
        return self._extents.swap(extents)

    def restore_extents(self, previous: object) -> None:
        """Put back the state :meth:`swap_extents` returned."""
        self._extents.restore(previous)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DiffusionStep) and (self.sigma, self.extents) == (other.sigma, other.extents)

    __hash__: ClassVar[None] = None  # type: ignore[assignment]  # equal by value and mutable: unhashable

    def __repr__(self) -> str:
        return f"DiffusionStep(sigma={self.sigma!r}, extents={self.extents!r})"


@dataclass(frozen=True)
class ExtrapolationSchedule:
    """How one axis extrapolates beyond ``original_length`` tokens, optionally following the diffusion time.

    Args:
        method: ``"pi"``, ``"ntk"``, ``"yarn"`` or ``"vision_yarn"``.
        original_length: extent of this axis at the training resolution, in coordinate units (Flux at 1024 px:
            64 tokens).
        dynamic: DyPE: the strength follows ``kappa(sigma)`` (not with ``"pi"``).
        lambda_s, lambda_t: DyPE's ``kappa = lambda_s * t ** lambda_t``; ``lambda_s`` defaults to 2 for ``ntk``
            and 1 for the YaRNs, ``lambda_t`` to 2.
        start_sigma: ``t = min(sigma / start_sigma, 1)``: full strength above ``start_sigma``.
        schedule_magnitude: scale YaRN's attention magnitude with ``min(kappa, 1)`` too.
        convention: ``"authors"`` (the DyPE authors' code, above) or ``"comfyui"`` (ComfyUI-DyPE's port, its
            ``vision_yarn`` (dynamic only), ``yarn`` and ``ntk``; ``k = lambda_s * sigma ** lambda_t`` with
            ``lambda_s`` 2 by default, turn counts ``** k``; scales from the longest image axis, see
            :meth:`_comfyui` and ``docs/extrapolation.md``).
        anisotropic: ``"comfyui"`` ``yarn`` only: ComfyUI-DyPE's ``yarn_alt_scaling`` (each axis above its own
            training extent at its own scale, magnitude ``0.1 ln s + 1``) instead of one isotropic scale.
    """

    method: str
    original_length: float
    dynamic: bool = False
    lambda_s: float | None = None
    lambda_t: float = 2.0
    start_sigma: float = 1.0
    schedule_magnitude: bool = True
    convention: str = "authors"
    anisotropic: bool = False

    def __post_init__(self) -> None:
        check_choice("method", self.method, METHODS)
        check_choice("convention", self.convention, CONVENTIONS)
        if self.convention == "comfyui" and self.method not in COMFYUI_METHODS:
            raise ValueError(
                f"convention='comfyui' has ComfyUI-DyPE's methods {COMFYUI_METHODS} (its node offers vision_yarn, "
                f"yarn, ntk and base, no position interpolation); got method={self.method!r}"
            )
        if self.convention == "comfyui" and self.method == "vision_yarn" and not self.dynamic:
            raise ValueError("convention='comfyui' vision_yarn is always dynamic in ComfyUI-DyPE: use dynamic=True")
        if self.anisotropic and (self.convention, self.method) != ("comfyui", "yarn"):
            raise ValueError(
                "anisotropic=True is ComfyUI-DyPE's yarn_alt_scaling: convention='comfyui', method='yarn' only"
            )
        check_finite_number("original_length", self.original_length, positive=True)
        if self.dynamic and self.method not in DYNAMIC_METHODS:
            raise ValueError(f"dynamic=True needs method in {DYNAMIC_METHODS}, got {self.method!r}")
        if self.lambda_s is None:
            default = COMFYUI_LAMBDA_S if self.convention == "comfyui" else DEFAULT_LAMBDA_S.get(self.method, 1.0)
            object.__setattr__(self, "lambda_s", default)
        for name in ("lambda_s", "lambda_t", "start_sigma"):
            check_finite_number(name, getattr(self, name), positive=True)

    def kappa(self, sigma: float) -> float:
        """DyPE's strength at noise level ``sigma`` (``lambda_s`` above ``start_sigma``, 0 at ``sigma = 0``)."""
        if check_finite_number("sigma", sigma) < 0:
            raise ValueError(f"sigma must be >= 0, got {sigma!r}")
        t = min(sigma / self.start_sigma, 1.0)
        return self.lambda_s * t**self.lambda_t

    def policy(
        self,
        extent: float,
        sigma: float | None = None,
        global_scale: float | None = None,
        longest: tuple[float, float] | None = None,
    ) -> Policy:
        """The static policy for an axis spanning ``extent`` coordinate units at noise level ``sigma``
        (``"comfyui"``: ``global_scale``, the largest ``extent / original_length`` over the image axes, and
        ``longest``, (the largest extent, the largest original length) over them; default this axis')."""
        scale = extent / self.original_length
        if self.convention == "comfyui":
            if global_scale is None:
                global_scale = scale
            if longest is None:
                longest = (extent, self.original_length)
            return self._comfyui(extent, scale, global_scale, longest, sigma)
        if scale <= 1:
            return NoExtrapolation()
        if not self.dynamic:
            return self._static(scale)
        if sigma is None:
            raise ValueError(
                "this DyPE schedule needs the step's sigma: set encoding.step.sigma (set_pe's hook "
                "does it from the transformer's timestep)"
            )
        kappa = self.kappa(sigma)
        if kappa == 0:
            return NoExtrapolation()
        magnitude = yarn_attention_factor(scale ** min(kappa, 1.0)) if self.schedule_magnitude else None
        if self.method == "ntk":
            return NTKAware(scale**kappa)
        if self.method == "yarn":
            return YaRN(scale, self.original_length, 32.0 * kappa, 1.0 * kappa, magnitude, clamp_low_end=True)
        return VisionYaRN(scale, self.original_length, threshold_scale=kappa, attention_factor=magnitude)

    def _comfyui(
        self, extent: float, scale: float, global_scale: float, longest: tuple[float, float], sigma: float | None
    ) -> Policy:
        """ComfyUI-DyPE's ``src/base.py`` ``_calc_*_components`` on this axis (re-implemented from its formulas):

        * ``vision_yarn``: :class:`VisionYaRN` at this axis' scale, NTK ladder at ``s_g = global_scale``, magnitude
          ``0.1 ln(s_g) min(sigma / start_sigma, 1) ** lambda_t + 1``; plain while ``s_g <= 1``;
        * ``ntk``: theta ``* s_g ** (k d / (d - 2))`` (``k = 1`` when not dynamic); plain while ``s_g <= 1``;
        * ``yarn``: one scale ``s = longest extent / longest original length`` on every image axis (its
          ``get_1d_yarn_pos_embed`` over ``0 .. longest - 1``), the turn counts over that original length, magnitude
          ``1 + 0.1 ln(s) / sqrt(s)``; ``anisotropic`` (``yarn_alt_scaling``): each axis above its own original
          length at its own scale, magnitude ``0.1 ln s + 1``; plain while the longest extent is within its length.
        """
        if self.method == "yarn":
            longest_extent, longest_length = longest
            if longest_extent <= longest_length or (self.anisotropic and extent <= self.original_length):
                return NoExtrapolation()
        elif global_scale <= 1:
            return NoExtrapolation()
        t = self._comfyui_time(sigma)
        k = 1.0 if t is None else self.lambda_s * t**self.lambda_t  # not dynamic: the turn counts as they are
        if self.method == "yarn":
            if self.anisotropic:
                s, length, magnitude = scale, self.original_length, 0.1 * math.log(scale) + 1.0
            else:
                s, length = longest_extent / longest_length, longest_length
                magnitude = 1.0 + 0.1 * math.log(s) / math.sqrt(s)
            return VisionYaRN(
                s, length, threshold_scale=k, attention_factor=magnitude, ntk_factor=s, threshold_power=True
            )
        if self.method == "ntk":
            factor = global_scale**k
            return NTKAware(factor) if factor > 1 else NoExtrapolation()
        assert t is not None  # comfyui vision_yarn is dynamic (checked in __post_init__)
        t_norm = 1.0 if t > self.start_sigma else t / self.start_sigma
        magnitude = 0.1 * math.log(global_scale) * t_norm**self.lambda_t + 1.0
        return VisionYaRN(
            max(scale, 1.0),
            self.original_length,
            threshold_scale=k,
            attention_factor=magnitude,
            ntk_factor=global_scale,
            threshold_power=True,
        )

    def _comfyui_time(self, sigma: float | None) -> float | None:
        """ComfyUI-DyPE's normalised timestep ``t = clamp(sigma, 0, 1)``; ``None`` when not dynamic."""
        if not self.dynamic:
            return None
        if sigma is None:
            raise ValueError("this DyPE schedule needs the step's sigma: set encoding.step.sigma")
        return min(max(check_finite_number("sigma", sigma), 0.0), 1.0)

    def _static(self, scale: float) -> Policy:
        if self.method == "pi":
            return PositionInterpolation(scale)
        if self.method == "ntk":
            return NTKAware(scale)
        if self.method == "yarn":
            return YaRN(scale, self.original_length)
        return VisionYaRN(scale, self.original_length)

    def describe(self) -> dict:
        """Plain values for configs and printing."""
        out = {"method": self.method, "original_length": self.original_length, "dynamic": self.dynamic}
        if not self.dynamic and self.convention != "authors":
            out["convention"] = self.convention
        if self.anisotropic:
            out["anisotropic"] = True
        if self.dynamic:
            out.update(
                convention=self.convention,
                lambda_s=self.lambda_s,
                lambda_t=self.lambda_t,
                start_sigma=self.start_sigma,
                schedule_magnitude=self.schedule_magnitude,
            )
        return out


PRESETS: dict[str, dict[str, Any]] = {
    "pi": dict(method="pi"),
    "ntk": dict(method="ntk"),
    "yarn": dict(method="yarn"),
    "vision_yarn": dict(method="vision_yarn"),
    "dype": dict(method="vision_yarn", dynamic=True),  # the paper's FLUX default: DyPE through vision YaRN
    "dype_ntk": dict(method="ntk", dynamic=True),
    "dype_yarn": dict(method="yarn", dynamic=True),
}


def extrapolation_preset(
    name: str, original_lengths: Sequence[float | None], **overrides: Any
) -> list[ExtrapolationSchedule | None]:
    """Per-axis extrapolation for a preset: a schedule on each axis with an original length, ``None`` elsewhere.

    ``extrapolation_preset("dype", (None, 64, 64))`` is DyPE on FLUX.1's row and column axes (1024 px training
    size, 16 px per token), leaving the text/index axis alone; ``overrides`` go to every schedule
    (``lambda_t=1.5``).
    """
    check_choice("extrapolation preset", name, tuple(PRESETS))
    return [
        None if length is None else ExtrapolationSchedule(original_length=length, **{**PRESETS[name], **overrides})
        for length in original_lengths
    ]


def is_schedule(spec: object) -> bool:
    return isinstance(spec, ExtrapolationSchedule) or (isinstance(spec, dict) and spec.get("type") == "schedule")


def make_schedule(spec: ExtrapolationSchedule | dict[str, Any]) -> ExtrapolationSchedule:
    """An :class:`ExtrapolationSchedule` or a dict ``{"type": "schedule", "method": "ntk", ...}`` (configs)."""
    if isinstance(spec, ExtrapolationSchedule):
        return spec
    args = {k: v for k, v in spec.items() if k != "type"}
    try:
        return ExtrapolationSchedule(**args)
    except TypeError as err:
        raise TypeError(f"extrapolation schedule: {err}") from None


@dataclass(eq=False)
class ScheduledSpectrum:
    """Per-axis policies or schedules -> the :class:`RotarySpectrum` at ``(extents, sigma)``.

    Args:
        allocation: ``chunked_spectrum`` or ``interleaved_spectrum``.
        axes_dims, theta: as the allocation takes them.
        extrapolation: one entry or one per axis: a static policy spec or a schedule.
        finish: applied to each built spectrum (``pair_scale``).
    """

    allocation: Callable
    axes_dims: tuple
    theta: object
    extrapolation: object
    finish: Callable[[RotarySpectrum], RotarySpectrum] = lambda spectrum: spectrum
    entries: tuple = field(init=False)

    def __post_init__(self) -> None:
        entries = per_axis("extrapolation", self.extrapolation, len(self.axes_dims))
        self.entries = tuple(make_schedule(e) if is_schedule(e) else make_policy(e) for e in entries)
        self._spectra = KeyedCache(max_entries=64)

    @property
    def dynamic(self) -> bool:
        """Some axis follows the diffusion time."""
        return any(isinstance(e, ExtrapolationSchedule) and e.dynamic for e in self.entries)

    def policies(self, extents: Sequence[float], sigma: float | None) -> tuple:
        """The static policy of each axis (hashable, equal by value: the cache key of tables). ``"comfyui"``
        schedules share the largest scale and the longest extent among them (ComfyUI-DyPE's scales from the longest
        image axis)."""
        comfyui = [
            (extent, e.original_length)
            for e, extent in zip(self.entries, extents)
            if isinstance(e, ExtrapolationSchedule) and e.convention == "comfyui"
        ]
        global_scale = max(extent / length for extent, length in comfyui) if comfyui else None
        longest = (max(extent for extent, _ in comfyui), max(length for _, length in comfyui)) if comfyui else None
        return tuple(
            e.policy(extent, sigma, global_scale, longest) if isinstance(e, ExtrapolationSchedule) else e
            for e, extent in zip(self.entries, extents)
        )

    def spectrum(self, policies: tuple) -> RotarySpectrum:
        """The spectrum of resolved ``policies``, built once per distinct value."""
        return self._spectra.get(
            policies, lambda: self.finish(self.allocation(self.axes_dims, self.theta, list(policies)))
        )

    def describe(self) -> list:
        return [e.describe() if isinstance(e, ExtrapolationSchedule) else repr(e) for e in self.entries]


def has_schedule(extrapolation: object) -> bool:
    """``extrapolation`` (one spec or one per axis) holds an :class:`ExtrapolationSchedule`."""
    entries = extrapolation if isinstance(extrapolation, (list, tuple)) else [extrapolation]
    return any(is_schedule(e) for e in entries)
