"""Multimodal RoPE of vision-language models and video DiTs: ``mrope``, ``mrope_interleave``, ``mhrope``, ``vrope``.

All four keep one frequency ladder ``theta ** (-2f / d_rot)`` (the language model's own) and change which
position axis a channel pair (or a head) reads; see :mod:`mmpos.spectrum.multimodal`. Coordinates are
``[L, A]`` or ``[B, L, A]`` floats (the MRoPE family also takes transformers' ``position_ids`` ``[3, B, L]`` from
``get_rope_index`` as they come): ``(t, h, w)`` ids for the MRoPE family (from
:func:`mmpos.coords.multimodal.multimodal_position_ids` for VLM sequences, or
:func:`mmpos.coords.video_grid` for a video DiT), the four VRoPE variant ids for ``vrope``
(:mod:`mmpos.coords.vrope`). Text tokens (equal ids on every axis) get exactly 1D RoPE in all of them
(MHRoPE: unless it has NoPE heads).

Papers: MRoPE, Qwen2-VL (arXiv 2409.12191); MRoPE-I and MHRoPE, "Revisiting Multimodal Positional
Encoding in Vision-Language Models" (arXiv 2510.23095); VRoPE (arXiv 2502.11664).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .._validation import check_positive_int
from ..coords.vrope import video_block_ids
from ..ops.tables import RotaryTable, axial_phases, table_from_phases
from ..spectrum.multimodal import (
    NOPE_HEAD,
    check_mrope_section,
    cyclic_axis_of_pair,
    default_head_section,
    default_mrope_section,
    head_axis_map,
    ladder_spectrum,
    query_head_map,
    section_axis_of_pair,
)
from .base import Capabilities
from .position_ids import ReadsPositionIds
from .registry import register_pe
from .rotary_base import RotaryPE, Table
from .spectrum_rope import SpectrumRoPE


def rotary_dim_of(head_dim: int, partial_rotary_factor: float) -> int:
    """Rotated channels ``int(head_dim * partial_rotary_factor)`` (Qwen3.5: 256 * 0.25 = 64), even and > 0."""
    check_positive_int("head_dim", head_dim)
    if not 0 < partial_rotary_factor <= 1:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial_rotary_factor!r}")
    rotary_dim = int(head_dim * partial_rotary_factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"head_dim={head_dim} * partial_rotary_factor={partial_rotary_factor} = {rotary_dim} "
            "rotary channels; expected a positive even number"
        )
    return rotary_dim


class LadderRoPE(SpectrumRoPE):
    """Rotary encoding with one frequency ladder and a fixed pair-to-axis map (base of the classes below)."""

    def __init__(
        self,
        head_dim: int,
        axis_of_pair: torch.Tensor,
        num_axes: int,
        theta: float,
        layout: str,
        num_prefix_tokens: int,
        seq_dim: int,
        table_precision: str,
        allocation: str,
    ):
        super().__init__(
            head_dim,
            ladder_spectrum(axis_of_pair, theta, num_axes),
            layout,
            num_prefix_tokens,
            seq_dim,
            table_precision,
            allocation,
        )


@register_pe("mrope")
class MRoPE(ReadsPositionIds, LadderRoPE):
    """MRoPE (Qwen2-VL): t, h, w read contiguous sections of one frequency ladder.

    Args:
        head_dim: channels per head.
        mrope_section: pairs per axis ``(s_t, s_h, s_w)``, adding up to ``rotary_dim // 2`` (Qwen2-VL
            ``(16, 24, 24)``); default ``(F - 2 (5F // 16), 5F // 16, 5F // 16)``.
        theta: ladder base (Qwen2-VL 1e6, Qwen3-VL 5e6, Qwen3.5 1e7).
        partial_rotary_factor: fraction of ``head_dim`` that rotates (Qwen3.5: 0.25).
        layout: ``"half"`` (rotate-half, the Qwen language models) or ``"interleaved"`` (Wan-style DiTs).
        num_prefix_tokens, seq_dim, table_precision: as :class:`~mmpos.encodings.rope_axial.AxialRoPE`.
    Coordinates: ``[L, 3]`` or ``[B, L, 3]`` ``(t, h, w)``.
    """

    description = "MRoPE (Qwen2-VL): t, h and w read contiguous sections of one frequency ladder."

    allocation_name = "chunked"
    example_options = dict(head_dim=16, mrope_section=(4, 2, 2))

    def __init__(
        self,
        head_dim: int,
        mrope_section: Sequence[int] | None = None,
        theta: float = 10000.0,
        partial_rotary_factor: float = 1.0,
        layout: str = "half",
        num_prefix_tokens: int = 0,
        seq_dim: int = -2,
        table_precision: str = "auto",
    ):
        num_pairs = rotary_dim_of(head_dim, partial_rotary_factor) // 2
        section = default_mrope_section(num_pairs) if mrope_section is None else mrope_section
        section = check_mrope_section(section, num_pairs, self.allocation_name)
        super().__init__(
            head_dim,
            section_axis_of_pair(section, self.allocation_name),
            len(section),
            theta,
            layout,
            num_prefix_tokens,
            seq_dim,
            table_precision,
            self.allocation_name,
        )
        self.mrope_section = section


@register_pe("mrope_interleave")
class MRoPEInterleave(MRoPE):
    """MRoPE-I (Qwen3-VL, Qwen3.5): t, h, w interleaved over one frequency ladder (each spans all of it).

    Pair f reads h if ``f % 3 == 1 and f < 3 s_h``, w if ``f % 3 == 2 and f < 3 s_w``, t otherwise.
    Arguments as :class:`MRoPE` (Qwen3-VL ``mrope_section=(24, 20, 20)``, theta 5e6; Qwen3.5
    ``(11, 11, 10)``, theta 1e7, ``partial_rotary_factor=0.25``; a Wan-like DiT ``(22, 21, 21)`` with
    ``layout="interleaved"``).
    """

    description = "MRoPE-I (Qwen3-VL, Qwen3.5): t, h and w interleaved over one frequency ladder."

    allocation_name = "interleaved"
    example_options = dict(head_dim=16, mrope_section=(4, 2, 2))


@register_pe("vrope")
class VRoPE(LadderRoPE):
    """VRoPE (video LLMs): pair f reads diagonal variant ``f % 4`` of the token's ids (no extra parameters).

    Coordinates: ``[L, 4]`` or ``[B, L, 4]`` variant ids from :mod:`mmpos.coords.vrope` (a video DiT grid:
    ``vrope.video_grid_ids(T, h, w)``; a VLM sequence: ``VRoPEState().ids(segments)`` or
    ``multimodal_position_ids(..., design="vrope")``). Arguments as :class:`MRoPE`.
    """

    description = "VRoPE (video LLMs): channel pair f reads diagonal variant f mod 4 of the token's ids."

    example_options = dict(head_dim=16)

    def __init__(
        self,
        head_dim: int,
        theta: float = 10000.0,
        partial_rotary_factor: float = 1.0,
        layout: str = "half",
        num_prefix_tokens: int = 0,
        seq_dim: int = -2,
        table_precision: str = "auto",
    ):
        num_pairs = rotary_dim_of(head_dim, partial_rotary_factor) // 2
        super().__init__(
            head_dim,
            cyclic_axis_of_pair(num_pairs, 4),
            4,
            theta,
            layout,
            num_prefix_tokens,
            seq_dim,
            table_precision,
            "cyclic",
        )

    def image_coords(self, height: int, width: int) -> torch.Tensor:
        """Variant ids ``[height * width, 4]`` (fp64) of one image (a one-frame video), e.g. for figures."""
        return video_block_ids(1, height, width).double()


@register_pe("mhrope")
class MHRoPE(ReadsPositionIds, RotaryPE):
    """MHRoPE: whole KV heads per axis; every head keeps the full spectrum; heads past the section are NoPE.

    Args:
        head_dim: channels per head.
        num_heads: query heads, a multiple of ``num_kv_heads``; query head g uses KV head
            ``g // (num_heads // num_kv_heads)`` (GQA).
        num_kv_heads: key/value heads (the table has one row per KV head); default ``num_heads``.
        head_section: KV heads per axis ``(n_t, n_h, n_w)``, sum at most ``num_kv_heads`` (the paper's
            ``(2, 3, 3)`` of 8); default ``(H - 2 (3H // 8), 3H // 8, 3H // 8)``.
        theta, partial_rotary_factor, layout, num_prefix_tokens, seq_dim: as :class:`MRoPE`.
    Coordinates: ``[L, 3]`` or ``[B, L, 3]``. Tables are ``[..., num_kv_heads, L, P]``; :meth:`rotate` accepts
    tensors with ``num_kv_heads`` (keys) or ``num_heads`` (queries) heads.
    """

    description = "MHRoPE: whole KV heads per axis, each with the full spectrum; heads past the section are NoPE."

    example_options = dict(head_dim=16, num_heads=4, head_section=(1, 1, 1))  # one NoPE head
    capabilities = Capabilities(relative=True, per_head_tables=True)
    kv_head_of_query: torch.Tensor  # a buffer

    def __init__(
        self,
        head_dim: int,
        num_heads: int = 8,
        num_kv_heads: int | None = None,
        head_section: Sequence[int] | None = None,
        theta: float = 10000.0,
        partial_rotary_factor: float = 1.0,
        layout: str = "half",
        num_prefix_tokens: int = 0,
        seq_dim: int = -2,
    ):
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        head_section = default_head_section(num_kv_heads) if head_section is None else head_section
        super().__init__(head_dim, len(head_section), layout, num_prefix_tokens, seq_dim)
        # the query -> KV head map is used on the table's device: a non-persistent int64 buffer follows
        # model.to(device) (never a dtype cast); the head -> axis map only builds tables, on the CPU with the spectrum
        self.register_buffer("kv_head_of_query", query_head_map(num_heads, num_kv_heads), persistent=False)
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_section = tuple(head_section)
        self.head_axis = head_axis_map(head_section, num_kv_heads)
        self.rotary_dim = rotary_dim_of(head_dim, partial_rotary_factor)
        self.spectrum = ladder_spectrum(torch.zeros(self.rotary_dim // 2, dtype=torch.int64), theta, 1)
        self._spectrum_key = self.spectrum.key()

    def table_key(self, complex_dtype: torch.dtype) -> tuple:
        return (self.head_section, self.num_kv_heads, self._spectrum_key, complex_dtype)

    def compute_table(self, coords: torch.Tensor, complex_dtype: torch.dtype) -> RotaryTable:
        num_pairs = self.rotary_dim // 2
        axis = self.head_axis.clamp_min(0).repeat_interleave(num_pairs)  # [H * P]
        inv_freq = self.spectrum.inv_freq.repeat(self.num_kv_heads)
        inv_freq = torch.where(self.head_axis.repeat_interleave(num_pairs) == NOPE_HEAD, 0.0, inv_freq)
        phase = axial_phases(coords, axis, inv_freq).unflatten(-1, (self.num_kv_heads, num_pairs))
        return table_from_phases(phase.movedim(-2, -3), None, complex_dtype)  # [..., H_kv, L, P]

    def rotate(self, x: torch.Tensor, table: Table) -> torch.Tensor:
        heads = x.shape[-3] if self.seq_dim == -2 else x.shape[-2]
        if heads == self.num_kv_heads or not isinstance(table, RotaryTable):  # the base refuses other tables
            return super().rotate(x, table)
        if heads != self.num_heads:
            raise ValueError(
                f"x has {heads} heads; this MHRoPE was built for num_kv_heads={self.num_kv_heads} "
                f"(keys) or num_heads={self.num_heads} (queries)"
            )
        if self.seq_dim == -2:
            return self._rotate_grouped(x, table)
        return super().rotate(x, RotaryTable(table.cis.index_select(-3, self.kv_head_of_query.to(table.cis.device))))

    def _rotate_grouped(self, x: torch.Tensor, table: RotaryTable) -> torch.Tensor:
        """Query heads ``[..., H, L, D]`` as ``[..., H_kv, group, L, D]``: the KV table broadcasts over each group
        (no copy). ``[B, H_kv, ...]`` is folded to ``[B * H_kv, ...]`` when that is a view (batch 1 or a
        batched table), so CUDA's fused 4-D kernel takes it."""
        grouped = x.unflatten(-3, (self.num_kv_heads, x.shape[-3] // self.num_kv_heads))
        cis = table.cis.unsqueeze(-3)  # [(B,) H_kv, 1, L, P]
        if grouped.dim() == 5 and (grouped.shape[0] == 1 or cis.dim() == 5):
            cis = cis if cis.dim() == 5 else cis.unsqueeze(0)
            folded = super().rotate(grouped.flatten(0, 1), RotaryTable(cis.flatten(0, 1)))
            return folded.unflatten(0, grouped.shape[:2]).flatten(-4, -3)
        return super().rotate(grouped, RotaryTable(cis)).flatten(-4, -3)

    def frequency_matrix(self) -> torch.Tensor:
        """``[H_kv, A, P]``: each head's frequency on its own axis, zero elsewhere (NoPE heads all zero)."""
        matrix = torch.zeros(self.num_kv_heads, self.num_axes, self.rotary_dim // 2, dtype=torch.float64)
        for head, axis in enumerate(self.head_axis.tolist()):
            if axis != NOPE_HEAD:
                matrix[head, axis] = self.spectrum.inv_freq
        return matrix

    def extra_repr(self) -> str:
        return (
            super().extra_repr() + f", num_kv_heads={self.num_kv_heads}, num_heads={self.num_heads}, "
            f"head_section={self.head_section}"
        )
