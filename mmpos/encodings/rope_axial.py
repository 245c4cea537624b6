"""Fixed-frequency rotary encodings: ``rope_axial`` (2D/3D/N-D axial) and ``rope_1d``."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch.types import Device

from .._per_thread import PerThread
from .._validation import as_int_tuple, check_choice, check_even, check_positive_int
from ..coords.grids import positions_1d
from ..spectrum.allocation import ALLOCATIONS, RotarySpectrum, default_axes_dims
from ..spectrum.schedule import DiffusionStep, ScheduledSpectrum, has_schedule
from .base import Capabilities
from .position_ids import ReadsPositionIds
from .registry import register_pe
from .rotary_base import Table
from .spectrum_rope import TABLE_PRECISIONS, SpectrumRoPE

__all__ = ["AxialRoPE", "RoPE1D", "TABLE_PRECISIONS"]


@register_pe("rope_axial")
class AxialRoPE(SpectrumRoPE):
    """Axial RoPE: each channel pair rotates with one coordinate axis at one frequency.

    Args:
        head_dim: channels per head.
        axes_dims: rotary channels per axis (Flux ``(16, 56, 56)``, Wan ``(44, 42, 42)``); default: split
            ``rotary_dim`` evenly over ``num_axes`` (axis 0 takes the remainder).
        num_axes: number of coordinate axes when ``axes_dims`` is not given (default 2).
        rotary_dim: rotated channels (partial rotary); default ``sum(axes_dims)`` or ``head_dim``.
        theta: base wavelength, one or one per axis.
        layout: ``"interleaved"`` (adjacent pairs) or ``"half"`` (rotate-half).
        allocation: ``"chunked"`` (each axis a block, own ladder) or ``"interleaved"`` (axes take turns over
            one ladder, MRoPE-I style).
        extrapolation: one policy or one per axis: ``None``, ``{"type": "ntk", "factor": 2}``, ``"pi"``,
            ``"yarn"``, ``"vision_yarn"``, ``"riflex"`` dicts, or objects from :mod:`mmpos.spectrum`; or
            schedules (:class:`~mmpos.spectrum.schedule.ExtrapolationSchedule`, ``{"type": "schedule", ...}``,
            :func:`~mmpos.spectrum.schedule.extrapolation_preset`): the factor then follows the coordinates'
            extent and, for DyPE, the step's sigma read from ``self.step`` (see :meth:`cached_table`,
            :meth:`spectrum_at`).
        pair_scale: optional ``[rotary_dim // 2]`` magnitude per pair (multiplies cos and sin).
        num_prefix_tokens: leading tokens (cls, registers, text) left unrotated.
        seq_dim: ``-2`` for ``[B, H, L, D]``, ``-3`` for ``[B, L, H, D]``.
        table_precision: ``"fp64"`` phases, ``"fp32_reduced"`` (no fp64 needed), or ``"auto"`` (fp64 where the
            device has it).
    """

    description = "Axial RoPE in 2D, 3D or N-D: each channel pair rotates with one axis at one frequency."

    example_options = dict(head_dim=16)
    capabilities = Capabilities(relative=True, takes_extrapolation=True, reads_image_grid=True)

    def __init__(
        self,
        head_dim: int,
        axes_dims: Sequence[int] | None = None,
        num_axes: int | None = None,
        rotary_dim: int | None = None,
        theta: float | Sequence[float] = 10000.0,
        layout: str = "interleaved",
        allocation: str = "chunked",
        extrapolation: object = None,
        pair_scale: torch.Tensor | Sequence[float] | None = None,
        num_prefix_tokens: int = 0,
        seq_dim: int = -2,
        table_precision: str = "auto",
    ):
        axes_dims, rotary_dim = _resolve_dims(head_dim, axes_dims, num_axes, rotary_dim)
        check_choice("allocation", allocation, tuple(ALLOCATIONS))
        finish = _pair_scaled(pair_scale)
        if has_schedule(extrapolation):
            schedule = ScheduledSpectrum(ALLOCATIONS[allocation], axes_dims, theta, extrapolation, finish)
            spectrum = schedule.spectrum(schedule.policies([0.0] * len(axes_dims), None))  # the training spectrum
        else:
            schedule, spectrum = None, finish(ALLOCATIONS[allocation](axes_dims, theta, extrapolation))
        super().__init__(head_dim, spectrum, layout, num_prefix_tokens, seq_dim, table_precision, allocation)
        self.axes_dims = axes_dims
        self.schedule: ScheduledSpectrum | None = schedule
        self.step = DiffusionStep()
        if schedule is not None:  # a seam may set the spectrum it resolved: per thread
            self.__dict__["_spectrum"] = PerThread(self.__dict__["_spectrum"])
        # the spectrum a compiled graph reads (see publish_schedule): updated in place, never rebound
        self.compiled_spectrum = None if schedule is None else _copied(spectrum)
        self.compiled_sigma = None if schedule is None else torch.ones((), dtype=torch.float64)  # the step's sigma
        self.published = False

    @property
    def spectrum(self) -> RotarySpectrum:
        """The training spectrum (with a schedule, a position seam may set the one it resolved; per thread)."""
        value = self.__dict__["_spectrum"]
        return value.get() if isinstance(value, PerThread) else value

    @spectrum.setter
    def spectrum(self, value: RotarySpectrum) -> None:
        held = self.__dict__.get("_spectrum")
        if isinstance(held, PerThread):
            held.set(value)
        else:
            self.__dict__["_spectrum"] = value

    def coordinate_extents(self, coords: torch.Tensor) -> list[float]:
        """``max - min + 1`` per axis of ``coords [..., L, A]`` (what a schedule reads; one device sync)."""
        return ((coords.amax(dim=-2) - coords.amin(dim=-2)).reshape(-1, self.num_axes).amax(0) + 1).tolist()

    def publish_schedule(self) -> None:
        """Resolve the schedule at ``self.step``'s extents and sigma (set before the blocks, eagerly) into
        ``compiled_spectrum`` (and the sigma into ``compiled_sigma``), in place: a graph ``torch.compile`` traced
        reads those tensors, so it follows the steps and sizes without recompiling (dynamo guards on tensor shapes,
        not values). Does nothing until both are set. One value per encoding, not per thread: a compiled model serves one forward at a time."""
        if self.schedule is None or self.compiled_spectrum is None:
            return
        extents, sigma = self.step.extents, self.step.sigma
        if extents is None or (sigma is None and self.schedule.dynamic):
            return
        spectrum = self.schedule.spectrum(self.schedule.policies(extents, sigma))
        with torch.no_grad():
            self.compiled_spectrum.inv_freq.copy_(spectrum.inv_freq)
            self.compiled_spectrum.magnitude.copy_(spectrum.magnitude)
            if sigma is not None and self.compiled_sigma is not None:
                self.compiled_sigma.fill_(sigma)
        self.published = True

    def cached_table(self, coords: torch.Tensor, complex_dtype: torch.dtype) -> Table:
        """With a schedule: the table of the spectrum resolved at the coordinates' extent per axis
        (:meth:`coordinate_extents`, or ``self.step.extents``) and ``self.step.sigma`` (both per thread), cached
        under the resolved policies (exact values), so a table is rebuilt only when the schedule's value changes. A
        lookup changes nothing on the encoding (``self.spectrum`` stays the training spectrum; :meth:`spectrum_at`
        gives the resolved one)."""
        schedule = self.schedule
        if schedule is None:
            return super().cached_table(coords, complex_dtype)
        if torch.compiler.is_compiling() and self.compiled_spectrum is not None:
            if not self.published:
                raise RuntimeError(
                    "a scheduled encoding (DyPE) under torch.compile reads the spectrum its model's hooks resolve "
                    "before the blocks (publish_schedule); this model's family gives no extents before the blocks "
                    "(no Family.global_coords), so it compiles only without fullgraph"
                )
            return self.table_of_spectrum(self.compiled_spectrum, coords, complex_dtype)
        policies = self._policies_at(coords)
        key = (policies, complex_dtype, self.table_precision)
        return self.cache.get(
            key, coords, lambda: self.table_of_spectrum(schedule.spectrum(policies), coords, complex_dtype)
        )

    def spectrum_at(self, coords: torch.Tensor) -> RotarySpectrum:
        """The spectrum of ``coords``' table: with a schedule, resolved at their extent and the step's sigma."""
        return self.spectrum if self.schedule is None else self.schedule.spectrum(self._policies_at(coords))

    def _policies_at(self, coords: torch.Tensor) -> tuple:
        """The schedule's policies at ``self.step.extents`` (else the coordinates' extents) and its sigma."""
        assert self.schedule is not None  # only encodings with a schedule resolve policies
        extents = self.step.extents
        if extents is None:
            extents = self.coordinate_extents(coords)
        return self.schedule.policies(extents, self.step.sigma)


@register_pe("rope_1d")
class RoPE1D(ReadsPositionIds, AxialRoPE):
    """1D RoPE over sequence positions (transformers' rotate-half layout by default).

    Coordinates are ``[L, 1]``, ``[B, L, 1]`` or ``[L]``, or transformers' ``position_ids`` ``[B, L]`` as they come;
    when omitted, positions ``0 .. L-1`` are used.
    Arguments as :class:`AxialRoPE` with one axis.
    """

    description = "1D RoPE over sequence positions (transformers' rotate-half layout by default)."

    example_options = dict(head_dim=16)
    capabilities = Capabilities(relative=True, takes_extrapolation=True)

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int | None = None,
        theta: float = 10000.0,
        layout: str = "half",
        extrapolation: object = None,
        pair_scale: torch.Tensor | Sequence[float] | None = None,
        num_prefix_tokens: int = 0,
        seq_dim: int = -2,
        table_precision: str = "auto",
    ):
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        super().__init__(
            head_dim,
            axes_dims=(rotary_dim,),
            rotary_dim=rotary_dim,
            theta=theta,
            layout=layout,
            extrapolation=extrapolation,
            pair_scale=pair_scale,
            num_prefix_tokens=num_prefix_tokens,
            seq_dim=seq_dim,
            table_precision=table_precision,
        )

    def default_coords(self, length: int, device: Device) -> torch.Tensor:
        return positions_1d(length, device=device)


def _copied(spectrum: RotarySpectrum) -> RotarySpectrum:
    """``spectrum`` with its own frequency and magnitude tensors (written in place later)."""
    return RotarySpectrum(
        spectrum.axis_of_pair, spectrum.inv_freq.clone(), spectrum.magnitude.clone(), spectrum.num_axes
    )


def _resolve_dims(
    head_dim: int, axes_dims: Sequence[int] | None, num_axes: int | None, rotary_dim: int | None
) -> tuple[tuple[int, ...], int]:
    """``(axes_dims, rotary_dim)`` from whichever of them was given (checked against each other)."""
    check_positive_int("head_dim", head_dim)
    if num_axes is not None:
        check_positive_int("num_axes", num_axes)
    if axes_dims is not None:
        dims = as_int_tuple("axes_dims", axes_dims)
        if not dims:
            raise ValueError("axes_dims must name at least one axis (rotary channels per axis)")
        for i, d in enumerate(dims):
            check_even(f"axes_dims[{i}]", d)
        if num_axes is not None and num_axes != len(dims):
            raise ValueError(f"num_axes={num_axes} disagrees with axes_dims={dims} ({len(dims)} axes)")
        if rotary_dim is not None and rotary_dim != sum(dims):
            raise ValueError(f"axes_dims={dims} add up to {sum(dims)}, not rotary_dim={rotary_dim}")
        rotary_dim = sum(dims)
    else:
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        check_even("rotary_dim", rotary_dim)
        dims = default_axes_dims(rotary_dim, 2 if num_axes is None else num_axes)
    if rotary_dim > head_dim:
        raise ValueError(f"rotary dims {rotary_dim} (axes_dims={dims}) exceed head_dim={head_dim}")
    if rotary_dim == 0:
        raise ValueError("rotary_dim must be positive; use create_pe('nope') for no positional encoding")
    return dims, rotary_dim


def _pair_scaled(pair_scale: torch.Tensor | Sequence[float] | None) -> Callable[[RotarySpectrum], RotarySpectrum]:
    """What finishes each built spectrum: its ``pair_scale`` magnitudes, or nothing."""
    if pair_scale is None:
        return lambda s: s
    return lambda s: s.with_pair_scale(pair_scale)
