"""Skew-symmetric generators and their exponentials (rotations), for learned rotary variants.

``exp(t * S)`` of a skew ``S`` is a rotation. Closed forms avoid ``torch.linalg.matrix_exp`` where they exist
(slow per small matrix on a CPU, for tables of many tokens: ``docs/results.md``): ``b = 2`` is one planar rotation,
``b = 4`` splits ``S`` into commuting self-dual and anti-self-dual parts, each squaring to ``-a^2 I``.
"""

from __future__ import annotations

import math

import torch


def matmul_safe_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """Dtype for small matrix products that must be full fp32: on CUDA, fp32 matmuls may run in TF32 (a user
    or library setting, ~1e-3 relative), so fp32 work is done in fp64 there; elsewhere ``dtype`` itself."""
    return torch.float64 if dtype == torch.float32 and torch.device(device).type == "cuda" else dtype


def skew_part(p: torch.Tensor) -> torch.Tensor:
    """``P - P^T`` over the last two dims (ComRoPE's parameterisation of a skew generator)."""
    return p - p.transpose(-1, -2)


def num_upper(dim: int) -> int:
    """Free entries of a ``dim x dim`` skew matrix."""
    return dim * (dim - 1) // 2


def skew_from_upper(values: torch.Tensor, dim: int) -> torch.Tensor:
    """``[..., dim*(dim-1)/2]`` strictly-upper entries (row-major) -> ``[..., dim, dim]`` skew matrix."""
    if values.shape[-1] != num_upper(dim):
        raise ValueError(f"values has {values.shape[-1]} entries; a {dim}x{dim} skew matrix has {num_upper(dim)}")
    rows, cols = torch.triu_indices(dim, dim, offset=1, device=values.device)
    upper = values.new_zeros(values.shape[:-1] + (dim, dim))
    upper = _scatter_upper(upper, values, rows, cols)
    return upper - upper.transpose(-1, -2)


def _scatter_upper(zeros: torch.Tensor, values: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    flat = zeros.flatten(-2)
    index = (rows * zeros.shape[-1] + cols).expand(values.shape)
    return flat.scatter(-1, index, values).unflatten(-1, zeros.shape[-2:])


def upper_of(skew: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`skew_from_upper`: ``[..., d, d]`` -> ``[..., d*(d-1)/2]`` (row-major upper entries)."""
    dim = skew.shape[-1]
    rows, cols = torch.triu_indices(dim, dim, offset=1, device=skew.device)
    return skew[..., rows, cols]


def hodge_dual_4(s: torch.Tensor) -> torch.Tensor:
    """Hodge dual ``(*S)_ij = 1/2 eps_ijkl S_kl`` of ``[..., 4, 4]`` skew matrices."""
    u = upper_of(s)  # s01 s02 s03 s12 s13 s23
    dual_upper = torch.stack([u[..., 5], -u[..., 4], u[..., 3], u[..., 2], -u[..., 1], u[..., 0]], dim=-1)
    return skew_from_upper(dual_upper, 4)


def self_dual_split(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``S = S+ + S-`` for ``[..., 4, 4]`` skew ``S``: the two parts commute and ``(S+-)^2 = -a+-^2 I``.

    Returns ``(s_plus, s_minus, a_plus, a_minus)`` with ``a`` of shape ``[...]`` (``a^2 = |S+-|_F^2 / 4``).
    """
    dual = hodge_dual_4(s)
    s_plus, s_minus = (s + dual) / 2, (s - dual) / 2
    tiny = torch.finfo(s.dtype).tiny  # sqrt has an infinite slope at 0; the true gradient there is 0
    a_plus = (s_plus.square().sum((-1, -2)) / 4).clamp_min(tiny).sqrt()
    a_minus = (s_minus.square().sum((-1, -2)) / 4).clamp_min(tiny).sqrt()
    return s_plus, s_minus, a_plus, a_minus


def rotation_2x2(angle: torch.Tensor) -> torch.Tensor:
    """``[..., 2, 2]`` rotation ``exp(angle * J)``, ``J = [[0, -1], [1, 0]]``."""
    cos, sin = angle.cos(), angle.sin()
    return torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)


def exp_skew(g: torch.Tensor) -> torch.Tensor:
    """``exp(G)`` of ``[..., b, b]`` skew matrices: closed forms for ``b = 2, 4``, ``matrix_exp`` otherwise."""
    if g.shape[-1] == 2:
        return rotation_2x2(g[..., 1, 0])
    if g.shape[-1] == 4:
        return exp_scaled_skew(g.new_ones(g.shape[:-2]), g)
    return torch.linalg.matrix_exp(g.contiguous())


def exp_scaled_skew(t: torch.Tensor, s: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``exp(t * S)`` for scalars ``t`` ``[...]`` and skew ``S`` ``[..., b, b]`` (broadcast), as ``dtype``.

    Angles are computed at the inputs' precision; ``b = 4`` combines its closed-form terms in ``dtype``.
    """
    if s.shape[-1] == 4:
        coefficients, basis = exp_scaled_skew_4_terms(t, s)
        return (coefficients.to(dtype or s.dtype)[..., None, None] * basis.to(dtype or s.dtype)).sum(-3)
    return exp_skew(t[..., None, None] * s).to(dtype or s.dtype)


def exp_scaled_skew_4_terms(t: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``exp(t * S) = sum_k c_k(t) B_k`` for scalars ``t`` ``[...]`` and 4x4 skew ``S`` ``[..., 4, 4]``.

    ``exp(tS) = exp(tS+) exp(tS-)`` and ``exp(tS+-) = cos(t a) I + (sin(t a) / a) S+-``, so the result is a
    combination of ``B = (I, S+, S-, S+ S-)`` with four scalar coefficients per entry of ``t``.
    Returns ``(c [..., 4], B [..., 4, 4, 4])`` with ``c`` broadcast over ``t`` and ``S``'s leading dims and ``B``
    over ``S``'s; contracting them with one ``einsum`` keeps a training step to a few passes over the table.
    """
    s_plus, s_minus, a_plus, a_minus = self_dual_split(s)
    cos_p, cos_m = (t * a_plus).cos(), (t * a_minus).cos()
    sinc_p = t * torch.sinc(t * a_plus / math.pi)  # sin(t a) / a, smooth at a = 0
    sinc_m = t * torch.sinc(t * a_minus / math.pi)
    coefficients = torch.stack([cos_p * cos_m, sinc_p * cos_m, cos_p * sinc_m, sinc_p * sinc_m], dim=-1)
    eye = torch.eye(4, dtype=s.dtype, device=s.device).expand_as(s_plus)
    return coefficients, torch.stack([eye, s_plus, s_minus, s_plus @ s_minus], dim=-3)
