"""Frequency allocation for multimodal RoPE: one frequency ladder, a map from channel pair (or head) to axis.

All variants here keep the language model's own ladder ``omega_f = theta ** (-2f / d_rot)`` and only decide
which position axis each pair reads:

- chunked MRoPE (Qwen2-VL): contiguous sections ``[s_t, s_h, s_w]`` of pairs, so t sees only the highest
  frequencies and w only the lowest;
- MRoPE-I (Qwen3-VL, Qwen3.5): pair ``f`` reads h if ``f % 3 == 1 and f < 3 s_h``, w if
  ``f % 3 == 2 and f < 3 s_w``, else t: every axis samples the whole spectrum;
- MHRoPE: whole KV heads per axis (``[n_t, n_h, n_w]`` heads), remaining heads NoPE;
- VRoPE: pair ``f`` reads diagonal variant ``f % 4`` (see :mod:`mmpos.coords.vrope`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .._validation import as_int_tuple, check_choice, check_positive_int
from .allocation import RotarySpectrum
from .frequencies import rope_inv_freq

SECTION_ALLOCATIONS = ("chunked", "interleaved")
NOPE_HEAD = -1  # head_axis value of a head without positional rotation


def check_mrope_section(section: Sequence[int], num_pairs: int, allocation: str = "chunked") -> tuple[int, ...]:
    """Validate ``mrope_section`` (pairs per axis ``t, h, w``) against ``num_pairs = rotary_dim // 2``.

    The counts must add up to ``num_pairs`` (so a wrong temporal count is an error, not ignored as in the
    interleaved reference code, which never reads ``s_t``), and an interleaved layout needs every
    non-temporal axis to fit into the ``THW`` pattern (``s_a <= s_t`` roughly; the exact bound is checked).
    """
    check_choice("allocation", allocation, SECTION_ALLOCATIONS)
    section = as_int_tuple("mrope_section", section)
    if len(section) < 1 or any(s < 0 for s in section):
        raise ValueError(f"mrope_section={section} must be non-negative pair counts, one per axis")
    if sum(section) != num_pairs:
        raise ValueError(
            f"mrope_section={section} adds up to {sum(section)} pairs but the rotary dim has {num_pairs} pairs "
            f"(rotary_dim={2 * num_pairs}); the temporal count must be {num_pairs - sum(section[1:])}"
        )
    if allocation == "interleaved":
        num_axes = len(section)
        for axis, pairs in enumerate(section[1:], start=1):
            last = axis + (pairs - 1) * num_axes
            if pairs and last >= num_pairs:
                raise ValueError(
                    f"mrope_section={section}: axis {axis} needs pair index {last} in the interleaved layout "
                    f"but there are only {num_pairs} pairs; give the temporal axis at least as many pairs"
                )
    return section


def section_axis_of_pair(section: Sequence[int], allocation: str = "chunked") -> torch.Tensor:
    """``[sum(section)]`` int64: the axis each pair reads (validated by :func:`check_mrope_section`)."""
    section = check_mrope_section(section, sum(as_int_tuple("mrope_section", section)), allocation)
    num_axes, num_pairs = len(section), sum(section)
    if allocation == "chunked":
        return torch.repeat_interleave(torch.arange(num_axes), torch.tensor(section))
    axis_of_pair = torch.zeros(num_pairs, dtype=torch.int64)
    for axis, pairs in enumerate(section[1:], start=1):
        axis_of_pair[axis : axis + pairs * num_axes : num_axes] = axis
    return axis_of_pair


def cyclic_axis_of_pair(num_pairs: int, num_axes: int) -> torch.Tensor:
    """Pair ``f`` reads axis ``f % num_axes`` (VRoPE's variant cycling)."""
    check_positive_int("num_pairs", num_pairs)
    return torch.arange(num_pairs) % num_axes


def ladder_spectrum(axis_of_pair: torch.Tensor, theta: float, num_axes: int) -> RotarySpectrum:
    """One ladder ``theta ** (-2f / d_rot)`` over all pairs, each pair reading ``axis_of_pair[f]``."""
    num_pairs = axis_of_pair.numel()
    inv_freq = rope_inv_freq(2 * num_pairs, theta)
    return RotarySpectrum(axis_of_pair.to(torch.int64), inv_freq, torch.ones_like(inv_freq), num_axes)


def default_mrope_section(num_pairs: int) -> tuple[int, int, int]:
    """Qwen3-VL's proportions ``[24, 20, 20]`` of 64 pairs, scaled: h = w = ``5 F // 16``, t the rest."""
    spatial = 5 * num_pairs // 16
    if spatial == 0:
        raise ValueError(f"rotary dim with {num_pairs} pairs is too small for 3 axes; pass mrope_section")
    return (num_pairs - 2 * spatial, spatial, spatial)


def check_head_section(head_section: Sequence[int], num_kv_heads: int) -> tuple[int, ...]:
    """MHRoPE's KV heads per axis; the sum may be below ``num_kv_heads`` (the rest are NoPE), never above."""
    check_positive_int("num_kv_heads", num_kv_heads)
    head_section = as_int_tuple("head_section", head_section)
    if not head_section or any(n < 0 for n in head_section):
        raise ValueError(f"head_section={head_section} must be non-negative head counts, one per axis")
    if sum(head_section) > num_kv_heads:
        raise ValueError(
            f"head_section={head_section} assigns {sum(head_section)} heads but there are only "
            f"num_kv_heads={num_kv_heads}"
        )
    return head_section


def default_head_section(num_kv_heads: int) -> tuple[int, int, int]:
    """The paper's ``[2, 3, 3]`` for 8 KV heads, scaled: h = w = ``3 H // 8``, t the rest."""
    spatial = 3 * check_positive_int("num_kv_heads", num_kv_heads) // 8
    if spatial == 0:
        raise ValueError(f"num_kv_heads={num_kv_heads} is too few for a default MHRoPE head split; pass head_section")
    return (num_kv_heads - 2 * spatial, spatial, spatial)


def head_axis_map(head_section: Sequence[int], num_kv_heads: int) -> torch.Tensor:
    """``[num_kv_heads]`` int64: axis of each KV head, :data:`NOPE_HEAD` for heads past the section."""
    head_section = check_head_section(head_section, num_kv_heads)
    axes = torch.repeat_interleave(torch.arange(len(head_section)), torch.tensor(head_section))
    return torch.cat([axes, torch.full((num_kv_heads - axes.numel(),), NOPE_HEAD, dtype=torch.int64)])


def query_head_map(num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """``[num_heads]``: the KV head each query head shares under GQA (``g // (num_heads // num_kv_heads)``)."""
    check_positive_int("num_heads", num_heads)
    check_positive_int("num_kv_heads", num_kv_heads)
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads} (GQA groups)")
    return torch.arange(num_heads) // (num_heads // num_kv_heads)
