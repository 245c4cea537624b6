"""``exp`` of a batch of matrices as a few matrix products, so that autograd differentiates it cheaply.

``torch.linalg.matrix_exp`` is fast forward, but its backward exponentiates the ``2n x 2n`` block matrix
``[[A^T, G], [0, A^T]]``: about eight times the forward's work (HARoPE's per-head ``128 x 128`` factors spent
most of a training step there; the measurement: ``docs/results.md``, "Numbers behind implementation choices"). Here ``exp(A) = T_m(A / 2^s)^(2^s)``: a Taylor polynomial of degree ``m``,
evaluated Paterson-Stockmeyer style (``A^2 .. A^p``, then Horner in ``A^p``), and ``s`` squarings. Autograd
goes back through those products by hand, two per product, after recomputing them (checkpointing: only ``A``
is kept for the backward, as with ``matrix_exp``): the backward costs about three times the forward. Both
directions are custom operators (``mmpos::taylor_matrix_exp``), which ``torch.compile`` calls as they are.

Degree and scaling are chosen per matrix from its 1-norm ``theta`` (one host read per call; matrices that
share a plan are computed together): the fewest products with ``(theta / 2^s)^m / (m + 1)! <= u`` (the
truncation, read as a relative backward error of ``A``, stays below the unit roundoff ``u``), with ``theta / 2^s <= 2`` so that the
terms of the polynomial never outgrow its sum by more than ``e^2`` (rounding). Meant for skew-symmetric
generators (rotations), whose exponential is perfectly conditioned; accurate to a few ``u`` there
(``tests/encodings/test_taylor_exp.py`` compares it with ``torch.linalg.matrix_exp`` in fp64).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch

MAX_SCALED_NORM = 2.0
# (degree m, block size p): m = p * q, evaluated with (p - 1) + (q - 1) products
PATERSON_STOCKMEYER = ((1, 1), (2, 2), (4, 2), (6, 3), (9, 3), (12, 4), (16, 4), (20, 5), (25, 5), (30, 6))


def taylor_matrix_exp(a: torch.Tensor) -> torch.Tensor:
    """``exp(a)`` for ``a`` ``[..., n, n]`` (float32 or float64), differentiable (see the module docstring)."""
    if a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"a must be [..., n, n] square matrices, got shape {tuple(a.shape)}")
    if a.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"a must be float32 or float64, got {a.dtype}")
    if a.numel() == 0:
        return torch.linalg.matrix_exp(a)
    return _exp_op(a)


def taylor_plan(theta: float, dtype: torch.dtype) -> tuple[int, int, int]:
    """``(degree, block, squarings)`` with the fewest matrix products for 1-norm ``theta`` in ``dtype``."""
    best = None
    for (degree, block), limit in zip(PATERSON_STOCKMEYER, _norm_limits(dtype)):
        squarings = max(0, math.ceil(math.log2(theta / limit))) if theta > limit else 0
        cost = (block - 1) + (degree // block - 1) + squarings
        if best is None or cost <= best[0]:  # ties: the higher degree, fewer squarings
            best = (cost, degree, block, squarings)
    assert best is not None  # PATERSON_STOCKMEYER is not empty
    return best[1:]


@lru_cache(maxsize=None)
def _norm_limits(dtype: torch.dtype) -> tuple[float, ...]:
    """Largest scaled 1-norm for each degree: ``theta^m / (m + 1)! <= u``, capped at ``MAX_SCALED_NORM``."""
    u = torch.finfo(dtype).eps / 2
    return tuple(min(MAX_SCALED_NORM, (u * math.factorial(m + 1)) ** (1.0 / m)) for m, _ in PATERSON_STOCKMEYER)


# ----- the operator: forward keeps only ``a``; backward recomputes and goes back by hand ---------------------
@torch.library.custom_op("mmpos::taylor_matrix_exp", mutates_args=())
def _exp_op(a: torch.Tensor) -> torch.Tensor:
    return _per_plan(lambda x, *plan: _expm_parts(x, *plan)[0], a)


@torch.library.custom_op("mmpos::taylor_matrix_exp_backward", mutates_args=())
def _exp_backward_op(a: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    return _per_plan(_expm_vjp, a, grad)


@_exp_op.register_fake
def _(a: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(a)


@_exp_backward_op.register_fake
def _(a: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(a)


def _save_input(ctx: Any, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[0])


def _exp_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    (a,) = ctx.saved_tensors
    return _exp_backward_op(a, grad)


_exp_op.register_autograd(_exp_backward, setup_context=_save_input)


def _per_plan(compute: Callable[..., torch.Tensor], a: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
    """``compute(a, *others, degree, block, squarings)`` with each matrix's own plan (matrices sharing one are
    computed together), so that a matrix's result never depends on the others in the batch."""
    norms = a.abs().sum(-2).amax(-1).flatten().tolist()  # 1-norm of each matrix (one host read)
    if not all(math.isfinite(theta) for theta in norms):
        raise ValueError("a has non-finite entries")
    plans = [taylor_plan(theta, a.dtype) for theta in norms]
    if len(set(plans)) == 1:
        return compute(a, *others, *plans[0])
    flat = [t.reshape(-1, *a.shape[-2:]) for t in (a, *others)]
    order, parts = [], []
    for plan in sorted(set(plans)):
        members = [i for i, p in enumerate(plans) if p == plan]
        order += members
        index = torch.tensor(members, device=a.device)
        parts.append(compute(*(t[index] for t in flat), *plan))
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return torch.cat(parts)[inverse.to(a.device)].reshape(a.shape)


_Saved = tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]


def _expm_parts(a: torch.Tensor, degree: int, block: int, squarings: int) -> tuple[torch.Tensor, _Saved]:
    """``exp(a)`` and what the backward needs: ``(x = a / 2^s, powers x..x^p, Horner inputs, squaring inputs)``.

    ``T(x) = (((c_m x^p + B_{q-1}) x^p + B_{q-2}) x^p + ...) + B_0`` with ``B_j = sum_{i < p} c_{jp+i} x^i``
    (``p = block``, ``q = degree / p``): ``p - 1`` products for the powers, ``q - 1`` for Horner's rule (each
    adds its ``B_j`` inside the product, ``baddbmm``). Works on ``[N, n, n]`` views of one buffer per kind."""
    shape, n = a.shape, a.shape[-1]
    powers = a.new_empty(block, a.numel() // (n * n), n, n)  # x, x^2, .., x^p
    torch.div(a.reshape(-1, n, n), 2.0**squarings, out=powers[0])
    x, horner, squares = powers[0], [], []
    if degree == 1:
        result = _plus_identity(x.clone(), 1.0)
    else:
        for i in range(1, block):
            torch.bmm(powers[i - 1], x, out=powers[i])
        c, top = _inverse_factorials(degree), powers[block - 1]
        sums = _block_sums(powers, c, degree // block, block)  # B_0 .. B_{q-1}
        result = sums[-1].add_(top, alpha=c[degree])
        for j in range(degree // block - 2, -1, -1):
            horner.append(result)
            result = torch.baddbmm(sums[j], result, top)
    for _ in range(squarings):
        squares.append(result)
        result = torch.bmm(result, result)
    return result.reshape(shape), (x, list(powers.unbind(0)), horner, squares)


def _expm_vjp(a: torch.Tensor, grad: torch.Tensor, degree: int, block: int, squarings: int) -> torch.Tensor:
    """``d<grad, exp(a)> / da``: the products of :func:`_expm_parts` recomputed, then reversed (two each)."""
    _, (x, powers, horner, squares) = _expm_parts(a, degree, block, squarings)
    g = grad.reshape(x.shape)
    for square in reversed(squares):  # S' = S S
        g = torch.baddbmm(g @ square.mT, square.mT, g)
    if degree == 1:
        return (g / 2.0**squarings).reshape(a.shape)
    c, top = _inverse_factorials(degree), powers[-1]
    block_grads, grad_top = [], None
    for previous in reversed(horner):  # R_j = R_{j+1} x^p + B_j, j = 0 .. q - 2
        block_grads.append(g)
        grad_top = previous.mT @ g if grad_top is None else torch.baddbmm(grad_top, previous.mT, g)
        g = g @ top.mT
    block_grads.append(g)  # R_{q-1} = c_m x^p + B_{q-1}
    grad_top = _accumulate(grad_top, g * c[degree])
    grad_power = grad_top  # of x^(i+1), going down the chain x^(i+1) = x^i x
    grad_x = None
    for i in range(block - 1, 0, -1):
        grad_x = (
            powers[i - 1].mT @ grad_power if grad_x is None else torch.baddbmm(grad_x, powers[i - 1].mT, grad_power)
        )
        grad_power = grad_power @ x.mT
        for j, block_grad in enumerate(block_grads):  # x^i in B_j with c_{jp+i}
            grad_power.add_(block_grad, alpha=c[j * block + i])
    grad_x = _accumulate(grad_x, grad_power)
    return (grad_x / 2.0**squarings if squarings else grad_x).reshape(a.shape)


def _inverse_factorials(degree: int) -> list[float]:
    return [1.0 / math.factorial(k) for k in range(degree + 1)]


def _block_sums(powers: torch.Tensor, c: list, count: int, block: int) -> torch.Tensor:
    """``B_j = c_{jp} I + sum_{0 < i < p} c_{jp+i} x^i`` for ``j < count``, ``[count, N, n, n]``, written into one
    buffer by scaled additions (a stacked tensordot costs more on a CPU: ``docs/results.md``)."""
    sums = powers.new_empty(count, *powers.shape[1:])
    for j in range(count):
        coefficients = c[j * block : (j + 1) * block]
        torch.mul(powers[0], coefficients[1], out=sums[j])
        for power, coefficient in zip(powers[1 : block - 1], coefficients[2:]):
            sums[j].add_(power, alpha=coefficient)
        _plus_identity(sums[j], coefficients[0])
    return sums


def _accumulate(total: torch.Tensor | None, term: torch.Tensor) -> torch.Tensor:
    return term if total is None else total.add_(term)


def _plus_identity(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x + scale * I`` in place on ``x`` (a fresh tensor)."""
    x.diagonal(dim1=-2, dim2=-1).add_(scale)
    return x
