"""Spectrum: frequency ladders, allocation of channel pairs to axes, extrapolation policies, band scales."""
from .allocation import ALLOCATIONS, RotarySpectrum, chunked_spectrum, default_axes_dims, interleaved_spectrum
from .bands import AXIS0_MODES, band_channel_scales, band_pair_scales, band_scale_per_pair, band_spectrum
from .extrapolation import RIFLEx, NoExtrapolation, NTKAware, PositionInterpolation, YaRN, make_policy
from .frequencies import rope_inv_freq

__all__ = [
    "ALLOCATIONS", "RotarySpectrum", "chunked_spectrum", "interleaved_spectrum", "default_axes_dims",
    "RIFLEx", "NoExtrapolation", "NTKAware", "PositionInterpolation", "YaRN", "make_policy", "rope_inv_freq",
    "AXIS0_MODES", "band_scale_per_pair", "band_pair_scales", "band_channel_scales", "band_spectrum",
]
