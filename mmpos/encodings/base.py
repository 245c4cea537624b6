"""The contract every registered encoding follows: a kind, explicit capabilities, example options.

=============  ==========================================  =============================================
kind           base class                                  call
=============  ==========================================  =============================================
``rotary``     :class:`~.rotary_base.RotaryPE`             ``q, k = pe(q, k, coords)``
``absolute``   :class:`~.absolute.AbsolutePE`              ``x = pe(x, coords)``
``camera``     :class:`CameraPE`                           ``geo = pe.prepare(cameras...)``, then attention
``none``       :class:`~.nope.NoPE`                        ``q, k = pe(q, k)`` (unchanged)
=============  ==========================================  =============================================

Integrations (timm, diffusers, the DiT) dispatch on ``kind`` and read ``capabilities``; they never guess
from option names. ``capabilities`` on the class describes the encoding built with its default options (readable
without building one: :func:`~.registry.pe_capabilities`); an instance whose options change a capability
(ComRoPE's training jitter, LieRE's ``block_size=2``) carries its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

import torch
from torch import nn

from ..ops.tables import ParameterValues


class PEKind(str, Enum):
    """What an encoding acts on; compares equal to its value (``PEKind.ROTARY == "rotary"``)."""

    ROTARY = "rotary"
    ABSOLUTE = "absolute"
    CAMERA = "camera"
    NONE = "none"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __repr__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Capabilities:
    """What an encoding guarantees or needs, read by tests and integrations.

    Attributes:
        relative: logits ``q^T k`` after encoding depend on the coordinates only through their offset.
        learnable: has trainable parameters (integrations then build one instance per block by default).
        needs_cameras: its inputs are cameras (poses, intrinsics, rays), not grid coordinates.
        per_head_tables: its tables have one row per head (``[..., H, L, P]``).
        jitters_coords: perturbs its own grid coordinates in training (a model that passes its tokens'
            coordinates cannot use it that way).
        takes_extrapolation: accepts ``extrapolation`` policies (PI, NTK, YaRN, RIFLEx).
        reads_image_grid: takes ``num_axes`` grid coordinates from a backbone (2 for images), so the timm and
            DiT integrations can supply (row, col).
        world_frame_invariant: (camera encodings) attention is invariant to the choice of world frame.
        folds_into_qkv: its map of q and k can go into a fused qkv projection (HARoPE's ``M q``, ``M^-T k``):
            it implements ``folds_into(x, projection)`` (whether folding pays for this input),
            ``fold_into_qkv(weight, bias)`` and ``rotate_mapped_qk(q, k, table)``; attention modules with a
            fused qkv and nothing between projection and encoding (timm ``Attention``, the DiT) then fold it.
    """

    relative: bool = False
    learnable: bool = False
    needs_cameras: bool = False
    per_head_tables: bool = False
    jitters_coords: bool = False
    takes_extrapolation: bool = False
    reads_image_grid: bool = False
    world_frame_invariant: bool = False
    folds_into_qkv: bool = False


def parameters_key(params: Iterable[torch.Tensor]) -> tuple | None:
    """Cache key of the current values of ``params`` (e.g. ``module.parameters()``), or ``None`` when what is
    built from them must not be cached.

    ``None`` while autograd needs the graph (grad mode on and a parameter requires grad): a cached table would
    carry a stale graph. Otherwise a one-element tuple holding a :class:`ParameterValues`, equal to another only
    when the parameters hold the same values: writes that bypass the version counter (``p.data.copy_``, as
    diffusers' ``EMAModel.copy_to`` does) cannot return a table built from other weights. Every learned encoding
    keys its caches with this one function.
    """
    params = list(params)
    if torch.is_grad_enabled() and any(p.requires_grad for p in params):
        return None
    return (ParameterValues(params),)


class CameraPE(nn.Module):
    """Base of camera encodings (``plucker``, ``prope``, ``rayrope``, ``ucpe``): no grid coordinates; the inputs
    are cameras, turned into per-token geometry by the subclass' ``prepare`` (or ``embed``)."""

    kind = PEKind.CAMERA
    capabilities = Capabilities(needs_cameras=True)
    num_axes = None  # no grid coordinates: inputs are cameras (see prepare / embed)
