"""Spectrum: frequency ladders, allocation of channel pairs to axes, extrapolation policies."""
from .allocation import ALLOCATIONS, RotarySpectrum, chunked_spectrum, default_axes_dims, interleaved_spectrum
from .extrapolation import RIFLEx, NoExtrapolation, NTKAware, PositionInterpolation, YaRN, make_policy
from .frequencies import rope_inv_freq

__all__ = [
    "ALLOCATIONS", "RotarySpectrum", "chunked_spectrum", "interleaved_spectrum", "default_axes_dims",
    "RIFLEx", "NoExtrapolation", "NTKAware", "PositionInterpolation", "YaRN", "make_policy", "rope_inv_freq",
]
