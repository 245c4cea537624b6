"""Unit phasors ``exp(i * phase)`` of learned phases, with a backward that reuses the forward's table.

Autograd through ``torch.complex(cos, sin)`` recomputes ``sin`` and ``cos`` in the backward; here the
phase gradient is ``Im(grad * conj(cis))``, one complex product (learned rotary tables are as large as q
when the batch is 1, so this is a quarter of a ComRoPE training step).
"""
from __future__ import annotations

import torch

from .tables import RotaryTable


def unit_phasor_table(phase: torch.Tensor, complex_dtype: torch.dtype) -> RotaryTable:
    """``RotaryTable(exp(i * phase))`` as ``complex_dtype``; differentiable in ``phase``."""
    real = torch.float64 if complex_dtype == torch.complex128 else torch.float32
    with torch.autocast(phase.device.type, enabled=False):
        if torch.is_grad_enabled() and phase.requires_grad:
            return RotaryTable(_UnitPhasor.apply(phase, real))
        return RotaryTable(torch.complex(phase.cos().to(real), phase.sin().to(real)))


class _UnitPhasor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, phase, real):
        cis = torch.complex(phase.cos().to(real), phase.sin().to(real))
        ctx.save_for_backward(cis)
        ctx.phase_dtype = phase.dtype
        return cis

    @staticmethod
    def backward(ctx, grad):
        (cis,) = ctx.saved_tensors
        return torch.imag(grad * cis.conj()).to(ctx.phase_dtype), None
