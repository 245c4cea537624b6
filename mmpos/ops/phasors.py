"""Learned phases: the unit phasor table ``exp(i * phase)`` and the rotation of q and k by it, with one backward.

Autograd through ``torch.complex(cos, sin)`` recomputes ``sin`` and ``cos`` in the backward; here the
phase gradient of a table is ``Im(grad * conj(cis))``, one complex product. Better still, when q and k are
rotated together (:func:`rotate_pair`, what every attention does), the phase gradient is
``Im(g_q conj(y_q) + g_k conj(y_k))`` with ``y`` the rotated outputs and ``g`` their gradients: no table
gradient per tensor, no product with the table, and only the outputs (which attention keeps anyway) saved.
A training step of a learned rotary encoding then costs the plain rotation plus the table and this sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._validation import check_choice
from .rotation import LAYOUTS, _check_and_move, _pairs, _rotate_into, compute_dtype, rotate, sum_to_shape
from .tables import RotaryTable


def unit_phasor_table(phase: torch.Tensor, complex_dtype: torch.dtype) -> RotaryTable:
    """``RotaryTable(exp(i * phase))`` as ``complex_dtype``; differentiable in ``phase``, which the table keeps
    (``table.phase``) for :func:`rotate_pair`."""
    real = torch.float64 if complex_dtype == torch.complex128 else torch.float32
    with torch.autocast(phase.device.type, enabled=False):
        if torch.is_grad_enabled() and phase.requires_grad:
            if torch.compiler.is_compiling():  # rotations read the phases (real arithmetic); cis for other uses
                return RotaryTable(torch.complex(phase.cos().to(real), phase.sin().to(real)), phase=phase)
            return RotaryTable(_UnitPhasor.apply(phase, real), phase=phase)
        return RotaryTable(unit_phasors(phase, real))


def unit_phasors(phase: torch.Tensor, real: torch.dtype) -> torch.Tensor:
    """``cos(phase) + i sin(phase)`` (computed at the phase's precision, rounded to ``real``), written straight
    into one complex buffer (``torch.complex(cos, sin)`` allocates three tensors; slower on a CPU: ``docs/results.md``)."""
    if torch.compiler.is_compiling():
        return torch.complex(phase.cos().to(real), phase.sin().to(real))
    pairs = torch.empty(*phase.shape, 2, dtype=real, device=phase.device)
    torch.cos(phase, out=pairs[..., 0])
    torch.sin(phase, out=pairs[..., 1])
    return torch.view_as_complex(pairs)


def trains_phases(table: object) -> bool:
    """Whether ``table`` carries learned phases that need a gradient now (eager mode)."""
    phase = getattr(table, "phase", None)
    return phase is not None and torch.is_grad_enabled() and phase.requires_grad and not torch.compiler.is_compiling()


def rotate_pair(
    q: torch.Tensor,
    k: torch.Tensor,
    table: RotaryTable,
    layout: str = "interleaved",
    *,
    seq_dim: int = -2,
    num_prefix_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rotate(q, table), rotate(k, table))`` (arguments as :func:`~mmpos.ops.rotation.rotate`); with learned
    phases (:func:`trains_phases`) one autograd node serves both (see the module docstring)."""
    if not trains_phases(table):
        options = dict(seq_dim=seq_dim, num_prefix_tokens=num_prefix_tokens)
        return rotate(q, table, layout, **options), rotate(k, table, layout, **options)
    check_choice("layout", layout, LAYOUTS)
    for x in (q, k):
        _check_and_move(x, table, seq_dim, num_prefix_tokens)
    return _RotatePairByPhase.apply(q, k, table.phase, table.cis.detach(), layout, seq_dim, num_prefix_tokens)


class _UnitPhasor(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, phase: torch.Tensor, real: torch.dtype) -> torch.Tensor:
        cis = unit_phasors(phase, real)
        ctx.save_for_backward(cis)
        ctx.phase_dtype = phase.dtype
        return cis

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (cis,) = ctx.saved_tensors
        return torch.imag(grad * cis.conj()).to(ctx.phase_dtype), None


class _RotatePairByPhase(torch.autograd.Function):
    """``y_q, y_k = q * cis, k * cis``; backward: ``g * conj(cis)`` for q and k, ``Im(g conj(y))`` for the phase."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        phase: torch.Tensor,
        cis: torch.Tensor,
        layout: str,
        seq_dim: int,
        num_prefix_tokens: int,
    ) -> tuple[torch.Tensor, ...]:
        outputs = tuple(
            _rotate_into(torch.empty_like(x), x, x.movedim(seq_dim, -2), cis, layout, seq_dim, num_prefix_tokens)
            for x in (q, k)
        )
        ctx.save_for_backward(*outputs, cis)
        ctx.args = (layout, seq_dim, num_prefix_tokens, phase.shape, phase.dtype)
        return outputs

    @staticmethod
    def backward(ctx: Any, grad_q: torch.Tensor | None, grad_k: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        y_q, y_k, cis = ctx.saved_tensors
        layout, seq_dim, n, phase_shape, phase_dtype = ctx.args
        given = [(i, g.contiguous(), y) for i, (g, y) in enumerate(((grad_q, y_q), (grad_k, y_k))) if g is not None]
        grads: list[torch.Tensor | None] = [None, None]
        inverse = cis.conj().resolve_conj()  # conjugated once, not per tensor
        for i, g, _ in given:
            if ctx.needs_input_grad[i]:
                grads[i] = _rotate_into(torch.empty_like(g), g, g.movedim(seq_dim, -2), inverse, layout, seq_dim, n)
        grad_phase = None
        if ctx.needs_input_grad[2] and given:
            pairs = [(g, y) for _, g, y in given]
            grad_phase = phase_gradient(pairs, 2 * cis.shape[-1], layout, seq_dim, n, phase_shape).to(phase_dtype)
        return grads[0], grads[1], grad_phase, None, None, None, None


def phase_gradient(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    rotary_dim: int,
    layout: str,
    seq_dim: int,
    n: int,
    phase_shape: Sequence[int],
) -> torch.Tensor:
    """``sum Im(g conj(y))`` over the ``(g, y)`` pairs (output gradient, rotated output), per rotation pair and
    summed down to ``phase_shape`` (the broadcast batch / head dims), in the rotation's compute dtype.

    Interleaved fp32 / fp64 pairs are read as complex numbers (one vectorised complex product per tensor,
    faster on a CPU than the real formula on strided halves: ``docs/results.md``); other layouts and 16-bit inputs take the real
    formula ``g_im y_re - g_re y_im``."""
    views = [tuple(t.movedim(seq_dim, -2)[..., n:, :rotary_dim] for t in pair) for pair in pairs]
    real = compute_dtype(pairs[0][1].dtype, pairs[0][1].device)
    if layout == "interleaved" and all(t.dtype == real and t.stride(-1) == 1 for pair in views for t in pair):
        total: torch.Tensor | None = None
        for g, y in views:
            g, y = (torch.view_as_complex(t.unflatten(-1, (-1, 2))) for t in (g, y))
            total = torch.mul(g, y.conj()) if total is None else total.addcmul_(g, y.conj())
        assert total is not None  # pairs is not empty (read above)
        return sum_to_shape(total, phase_shape).imag
    total = None
    for g, y in views:
        g_pairs, y_pairs = (_pairs(t, layout).to(real) for t in (g, y))
        if total is None:
            total = g_pairs[..., 1] * y_pairs[..., 0]
        else:
            total.addcmul_(g_pairs[..., 1], y_pairs[..., 0])
        total.addcmul_(g_pairs[..., 0], y_pairs[..., 1], value=-1)
    assert total is not None
    return sum_to_shape(total, phase_shape)
