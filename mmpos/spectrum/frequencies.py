"""The geometric frequency ladder of RoPE, in fp64."""

from __future__ import annotations

import torch

from .._validation import check_even, check_theta


def rope_inv_freq(dim: int, theta: float) -> torch.Tensor:
    """Inverse frequencies ``theta ** (-2i / dim)`` for ``i < dim // 2``.

    Args:
        dim: rotary channels of this axis (even).
        theta: base wavelength (10000 for Flux/Wan, 100 for DINOv3/rope-vit axial).
    Returns:
        ``[dim // 2]`` float64, the same expression (and bits) as diffusers' ``get_1d_rotary_pos_embed``.
    """
    check_even("dim", dim)
    check_theta("theta", theta)
    exponents = torch.arange(0, dim, 2, dtype=torch.float64)[: dim // 2] / dim
    return 1.0 / (theta**exponents)
