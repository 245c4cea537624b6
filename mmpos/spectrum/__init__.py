"""Spectrum: frequency ladders, allocation of channel pairs to axes, extrapolation policies and schedules
(DyPE), band scales."""

from .allocation import ALLOCATIONS, RotarySpectrum, chunked_spectrum, default_axes_dims, interleaved_spectrum
from .bands import AXIS0_MODES, band_channel_scales, band_pair_scales, band_scale_per_pair, band_spectrum
from .extrapolation import (
    NoExtrapolation,
    NTKAware,
    PositionInterpolation,
    RIFLEx,
    VisionYaRN,
    YaRN,
    make_policy,
    riflex_intrinsic_k,
)
from .frequencies import rope_inv_freq
from .schedule import PRESETS, DiffusionStep, ExtrapolationSchedule, ScheduledSpectrum, extrapolation_preset

__all__ = [
    "ALLOCATIONS",
    "RotarySpectrum",
    "chunked_spectrum",
    "interleaved_spectrum",
    "default_axes_dims",
    "RIFLEx",
    "NoExtrapolation",
    "NTKAware",
    "PositionInterpolation",
    "VisionYaRN",
    "YaRN",
    "make_policy",
    "riflex_intrinsic_k",
    "rope_inv_freq",
    "ExtrapolationSchedule",
    "ScheduledSpectrum",
    "DiffusionStep",
    "extrapolation_preset",
    "PRESETS",
    "AXIS0_MODES",
    "band_scale_per_pair",
    "band_pair_scales",
    "band_channel_scales",
    "band_spectrum",
]
