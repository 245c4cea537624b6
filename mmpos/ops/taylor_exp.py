"""``exp`` of a batch of matrices as a few matrix products, so that autograd differentiates it cheaply.

``torch.linalg.matrix_exp`` is fast forward, but its backward exponentiates the ``2n x 2n`` block matrix
``[[A^T, G], [0, A^T]]``: about eight times the forward's work (HARoPE's per-head ``128 x 128`` factors spent
~90% of a training step there). Here ``exp(A) = T_m(A / 2^s)^(2^s)``: a Taylor polynomial of degree ``m``,
evaluated Paterson-Stockmeyer style (``A^2 .. A^p``, then Horner in ``A^p``), and ``s`` squarings. Autograd
goes back through those products, two per product, after recomputing them (checkpointing: only ``A`` is
kept for the backward, as with ``matrix_exp``): the backward costs about three times the forward.

Degree and scaling are chosen per matrix from its 1-norm ``theta`` (one host read per call; matrices that
share a plan are computed together): the fewest products with ``(theta / 2^s)^m / (m + 1)! <= u`` (the
truncation, read as a relative backward error of ``A``, stays below the unit roundoff ``u``), with ``theta / 2^s <= 2`` so that the
terms of the polynomial never outgrow its sum by more than ``e^2`` (rounding). Meant for skew-symmetric
generators (rotations), whose exponential is perfectly conditioned; accurate to a few ``u`` there
(``tests/test_taylor_exp.py`` compares it with ``torch.linalg.matrix_exp`` in fp64).
Under ``torch.compile`` (no host reads while tracing) it is ``torch.linalg.matrix_exp``.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch.utils.checkpoint import checkpoint

MAX_SCALED_NORM = 2.0
# (degree m, block size p): m = p * q, evaluated with (p - 1) + (q - 1) products
PATERSON_STOCKMEYER = ((1, 1), (2, 2), (4, 2), (6, 3), (9, 3), (12, 4), (16, 4), (20, 5), (25, 5), (30, 6))


def taylor_matrix_exp(a: torch.Tensor) -> torch.Tensor:
    """``exp(a)`` for ``a`` ``[..., n, n]`` (float32 or float64), differentiable (see the module docstring)."""
    if a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"a must be [..., n, n] square matrices, got shape {tuple(a.shape)}")
    if a.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"a must be float32 or float64, got {a.dtype}")
    if torch.compiler.is_compiling() or a.numel() == 0:
        return torch.linalg.matrix_exp(a)
    if torch.is_grad_enabled() and a.requires_grad:  # keep only ``a`` for the backward, which recomputes
        return checkpoint(_taylor_matrix_exp, a, use_reentrant=False)
    return _taylor_matrix_exp(a)


def _taylor_matrix_exp(a: torch.Tensor) -> torch.Tensor:
    norms = a.detach().abs().sum(-2).amax(-1).flatten().tolist()  # 1-norm of each matrix (one host read)
    if not all(math.isfinite(theta) for theta in norms):
        raise ValueError("a has non-finite entries")
    plans = [taylor_plan(theta, a.dtype) for theta in norms]
    if len(set(plans)) == 1:
        return _scaled_and_squared(a, *plans[0])
    # each matrix by its own plan, so that a matrix's result never depends on the others in the batch
    flat, order, parts = a.reshape(-1, *a.shape[-2:]), [], []
    for plan in sorted(set(plans)):
        members = [i for i, p in enumerate(plans) if p == plan]
        order += members
        parts.append(_scaled_and_squared(flat[members], *plan))
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return torch.cat(parts)[inverse.to(a.device)].reshape(a.shape)


def _scaled_and_squared(a: torch.Tensor, degree: int, block: int, squarings: int) -> torch.Tensor:
    result = _taylor_polynomial(a / 2.0**squarings if squarings else a, degree, block)
    for _ in range(squarings):
        result = result @ result
    return result


def taylor_plan(theta: float, dtype: torch.dtype) -> tuple[int, int, int]:
    """``(degree, block, squarings)`` with the fewest matrix products for 1-norm ``theta`` in ``dtype``."""
    best = None
    for (degree, block), limit in zip(PATERSON_STOCKMEYER, _norm_limits(dtype)):
        squarings = max(0, math.ceil(math.log2(theta / limit))) if theta > limit else 0
        cost = (block - 1) + (degree // block - 1) + squarings
        if best is None or cost <= best[0]:  # ties: the higher degree, fewer squarings
            best = (cost, degree, block, squarings)
    return best[1:]


@lru_cache(maxsize=None)
def _norm_limits(dtype: torch.dtype) -> tuple[float, ...]:
    """Largest scaled 1-norm for each degree: ``theta^m / (m + 1)! <= u``, capped at ``MAX_SCALED_NORM``."""
    u = torch.finfo(dtype).eps / 2
    return tuple(min(MAX_SCALED_NORM, (u * math.factorial(m + 1)) ** (1.0 / m)) for m, _ in PATERSON_STOCKMEYER)


def _taylor_polynomial(a: torch.Tensor, degree: int, block: int) -> torch.Tensor:
    """``sum_{k <= degree} a^k / k!`` with ``block - 1`` products for the powers and ``degree / block - 1``
    for Horner's rule in ``a^block``: ``(((c_m a^p + B_{q-1}) a^p + B_{q-2}) a^p + ...) + B_0`` with
    ``B_j = sum_{i < p} c_{jp+i} a^i``."""
    if degree == 1:
        return _plus_identity(a.clone(), 1.0)
    powers = [a]
    for _ in range(block - 1):
        powers.append(powers[-1] @ a)
    inverse_factorials = [1.0 / math.factorial(k) for k in range(degree + 1)]

    def block_sum(j):  # B_j, from scaled additions (a stacked tensordot costs ~15x more on a CPU)
        c = inverse_factorials[j * block: (j + 1) * block]
        total = powers[0] * c[1]
        for power, coefficient in zip(powers[1: block - 1], c[2:]):
            total = total.add(power, alpha=coefficient)
        return _plus_identity(total, c[0])

    num_blocks = degree // block
    result = block_sum(num_blocks - 1).add(powers[-1], alpha=inverse_factorials[degree])
    for j in range(num_blocks - 2, -1, -1):
        result = (result @ powers[-1]).add_(block_sum(j))
    return result


def _plus_identity(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x + scale * I`` in place on ``x`` (a fresh tensor)."""
    x.diagonal(dim1=-2, dim2=-1).add_(scale)
    return x
