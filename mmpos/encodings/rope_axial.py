"""Fixed-frequency rotary encodings: ``rope_axial`` (2D/3D/N-D axial) and ``rope_1d``."""
from __future__ import annotations

from typing import Sequence


from .._validation import check_choice, check_even, check_positive_int
from ..coords.grids import positions_1d
from ..ops.tables import TableCache, axial_phases, device_has_fp64, phases_fp32_reduced, table_from_phases
from ..spectrum.allocation import ALLOCATIONS, default_axes_dims
from .registry import register_pe
from .rotary_base import RotaryPE

TABLE_PRECISIONS = ("auto", "fp64", "fp32_reduced")


@register_pe("rope_axial")
class AxialRoPE(RotaryPE):
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
            ``"yarn"``, ``"riflex"`` dicts, or objects from :mod:`mmpos.spectrum`.
        pair_scale: optional ``[rotary_dim // 2]`` magnitude per pair (multiplies cos and sin).
        num_prefix_tokens: leading tokens (cls, registers, text) left unrotated.
        seq_dim: ``-2`` for ``[B, H, L, D]``, ``-3`` for ``[B, L, H, D]``.
        table_precision: ``"fp64"`` phases, ``"fp32_reduced"`` (no fp64 needed), or ``"auto"`` (fp64 where the
            device has it).
    """

    def __init__(self, head_dim: int, axes_dims: Sequence[int] | None = None, num_axes: int | None = None,
                 rotary_dim: int | None = None, theta=10000.0, layout: str = "interleaved",
                 allocation: str = "chunked", extrapolation=None, pair_scale=None, num_prefix_tokens: int = 0,
                 seq_dim: int = -2, table_precision: str = "auto"):
        axes_dims, rotary_dim = _resolve_dims(head_dim, axes_dims, num_axes, rotary_dim)
        super().__init__(head_dim, len(axes_dims), layout, num_prefix_tokens, seq_dim)
        check_choice("allocation", allocation, tuple(ALLOCATIONS))
        check_choice("table_precision", table_precision, TABLE_PRECISIONS)
        spectrum = ALLOCATIONS[allocation](axes_dims, theta, extrapolation)
        if pair_scale is not None:
            spectrum = spectrum.with_pair_scale(pair_scale)
        self.axes_dims, self.rotary_dim, self.allocation = axes_dims, rotary_dim, allocation
        self.table_precision = table_precision
        self.spectrum = spectrum
        self._spectrum_key = spectrum.key()
        self.cache = TableCache()

    def build_table(self, coords, complex_dtype):
        key = (self._spectrum_key, complex_dtype, self.table_precision)
        return self.cache.get(key, coords, lambda: self._fresh_table(coords, complex_dtype))

    def _fresh_table(self, coords, complex_dtype):
        spectrum = self.spectrum
        use_fp64 = self.table_precision == "fp64" or (
            self.table_precision == "auto" and device_has_fp64(coords.device))
        if use_fp64:
            phase = axial_phases(coords, spectrum.axis_of_pair, spectrum.inv_freq)
        else:
            phase = phases_fp32_reduced(coords, spectrum.frequency_matrix())
        if coords.dim() == 3:
            phase = phase.unsqueeze(-3)  # [B, 1, L, P]: shared by the heads
        magnitude = None if bool((spectrum.magnitude == 1).all()) else spectrum.magnitude
        return table_from_phases(phase, magnitude, complex_dtype)

    def frequency_matrix(self):
        return self.spectrum.frequency_matrix()

    def extra_repr(self):
        return (super().extra_repr() + f", axes_dims={self.axes_dims}, allocation={self.allocation!r}")


@register_pe("rope_1d")
class RoPE1D(AxialRoPE):
    """1D RoPE over sequence positions (transformers' rotate-half layout by default).

    Coordinates are ``[L, 1]``, ``[B, L, 1]`` or ``[L]``; when omitted, positions ``0 .. L-1`` are used.
    Arguments as :class:`AxialRoPE` with one axis.
    """

    def __init__(self, head_dim: int, rotary_dim: int | None = None, theta: float = 10000.0, layout: str = "half",
                 extrapolation=None, pair_scale=None, num_prefix_tokens: int = 0, seq_dim: int = -2,
                 table_precision: str = "auto"):
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        super().__init__(head_dim, axes_dims=(rotary_dim,), rotary_dim=rotary_dim, theta=theta, layout=layout,
                         extrapolation=extrapolation, pair_scale=pair_scale, num_prefix_tokens=num_prefix_tokens,
                         seq_dim=seq_dim, table_precision=table_precision)

    def default_coords(self, length, device):
        return positions_1d(length, device=device)


def _resolve_dims(head_dim, axes_dims, num_axes, rotary_dim):
    check_positive_int("head_dim", head_dim)
    if axes_dims is not None:
        axes_dims = tuple(int(d) for d in axes_dims)
        for i, d in enumerate(axes_dims):
            check_even(f"axes_dims[{i}]", d)
        if num_axes is not None and num_axes != len(axes_dims):
            raise ValueError(f"num_axes={num_axes} disagrees with axes_dims={axes_dims} ({len(axes_dims)} axes)")
        if rotary_dim is not None and rotary_dim != sum(axes_dims):
            raise ValueError(f"axes_dims={axes_dims} add up to {sum(axes_dims)}, not rotary_dim={rotary_dim}")
        rotary_dim = sum(axes_dims)
    else:
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        check_even("rotary_dim", rotary_dim)
        axes_dims = default_axes_dims(rotary_dim, 2 if num_axes is None else num_axes)
    if rotary_dim > head_dim:
        raise ValueError(f"rotary dims {rotary_dim} (axes_dims={axes_dims}) exceed head_dim={head_dim}")
    if rotary_dim == 0:
        raise ValueError("rotary_dim must be positive; use create_pe('nope') for no positional encoding")
    return axes_dims, rotary_dim
