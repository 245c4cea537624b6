"""Base of fixed-spectrum rotary encodings: a ready :class:`~mmpos.spectrum.allocation.RotarySpectrum` read on
coordinates (pair ``p`` turns at ``inv_freq[p]`` radians per unit of axis ``axis_of_pair[p]``).

:class:`~.rope_axial.AxialRoPE` builds its spectrum from axes dims and extrapolation policies, the multimodal
family (:mod:`.rope_multimodal`) from one language-model ladder; both hand it to this base, which owns the table.
"""

from __future__ import annotations

import torch

from .._validation import check_choice
from ..ops.tables import RotaryTable, axial_phases, device_has_fp64, phases_fp32_reduced, table_from_phases
from ..spectrum.allocation import RotarySpectrum
from .rotary_base import RotaryPE

TABLE_PRECISIONS = ("auto", "fp64", "fp32_reduced")


class SpectrumRoPE(RotaryPE):
    """Rotary encoding with a fixed spectrum; no parameters.

    Args:
        head_dim: channels per head (at least ``spectrum.rotary_dim``; the rest are not rotated).
        spectrum: which axis and frequency each channel pair reads (and its magnitude).
        layout, num_prefix_tokens, seq_dim: as :class:`~.rope_axial.AxialRoPE`.
        table_precision: ``"fp64"`` phases, ``"fp32_reduced"`` (no fp64 needed), or ``"auto"`` (fp64 where the
            device has it).
        allocation: name of the pair-to-axis scheme, for ``repr`` and plots.
    """

    def __init__(
        self,
        head_dim: int,
        spectrum: RotarySpectrum,
        layout: str,
        num_prefix_tokens: int,
        seq_dim: int,
        table_precision: str,
        allocation: str,
    ):
        super().__init__(head_dim, spectrum.num_axes, layout, num_prefix_tokens, seq_dim)
        check_choice("table_precision", table_precision, TABLE_PRECISIONS)
        if spectrum.rotary_dim > head_dim:
            raise ValueError(f"the spectrum rotates {spectrum.rotary_dim} channels; head_dim={head_dim}")
        self.spectrum, self.table_precision, self.allocation = spectrum, table_precision, allocation
        self.rotary_dim = spectrum.rotary_dim
        self.axes_dims = tuple(2 * int((spectrum.axis_of_pair == a).sum()) for a in range(spectrum.num_axes))
        self._spectrum_key = spectrum.key()

    def table_key(self, complex_dtype: torch.dtype) -> tuple:
        return (self._spectrum_key, complex_dtype, self.table_precision)

    def compute_table(self, coords: torch.Tensor, complex_dtype: torch.dtype) -> RotaryTable:
        return self.table_of_spectrum(self.spectrum, coords, complex_dtype)

    def spectrum_at(self, coords: torch.Tensor) -> RotarySpectrum:
        """The spectrum the table of ``coords`` ``[..., L, A]`` uses: ``self.spectrum`` (an encoding whose
        spectrum follows a schedule resolves it here, without changing ``self.spectrum``)."""
        return self.spectrum

    def table_of_spectrum(
        self, spectrum: RotarySpectrum, coords: torch.Tensor, complex_dtype: torch.dtype
    ) -> RotaryTable:
        """The table of ``spectrum`` on validated ``coords`` ``[L, A]`` or ``[B, L, A]``."""
        use_fp64 = self.table_precision == "fp64" or (self.table_precision == "auto" and device_has_fp64(coords.device))
        if use_fp64:
            phase = axial_phases(coords, spectrum.axis_of_pair, spectrum.inv_freq)
        else:
            phase = phases_fp32_reduced(coords, spectrum.frequency_matrix())
        if coords.dim() == 3:
            phase = phase.unsqueeze(-3)  # [B, 1, L, P]: shared by the heads
        magnitude = spectrum.magnitude  # all ones: multiplying is exact, and a traced graph has no branch on data
        ones = not torch.compiler.is_compiling() and bool((magnitude == 1).all())
        return table_from_phases(phase, None if ones else magnitude, complex_dtype)

    def frequency_matrix(self) -> torch.Tensor:
        return self.spectrum.frequency_matrix()

    def extra_repr(self) -> str:
        return super().extra_repr() + f", axes_dims={self.axes_dims}, allocation={self.allocation!r}"
