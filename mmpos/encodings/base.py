"""The contract every registered encoding follows: a kind, explicit capabilities, example options.

=============  ==========================================  =============================================
kind           base class                                  call
=============  ==========================================  =============================================
``rotary``     :class:`~.rotary_base.RotaryPE`             ``q, k = pe(q, k, coords)``
``absolute``   :class:`~.absolute.AbsolutePE`              ``x = pe(x, coords)``
``camera``     :class:`CameraPE`                           ``geo = pe.prepare(cameras)``, ``pe.attention(q, k, v, geo)``
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
from typing import Any, ClassVar, Iterable

import torch
from torch import nn

from ..camera.cameras import Cameras
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
        additive: (camera encodings) the encoding is an embedding added to the tokens (``embed_tokens``); its
            ``attention`` is plain SDPA (Plücker rays).
        predicts_depth: (camera encodings) ``attention`` reads per-token depths predicted in every layer by the
            head ``cls.depth_head(dim)`` (passed as ``depth_q=``; RayRoPE).
        adapter: (camera encodings) ``cls.adapter_layer(...)`` builds a zero-initialised per-layer adapter for a
            frozen host attention (the kinds of ``mmpos.integrations.diffusers.CameraAdapter``).
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
    additive: bool = False
    predicts_depth: bool = False
    adapter: bool = False
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


class PositionalEncoding(nn.Module):
    """Base of every registered encoding (:class:`~.rotary_base.RotaryPE`, :class:`~.absolute.AbsolutePE`,
    :class:`CameraPE`, :class:`~.nope.NoPE`): what the registry and the integrations read, declared once.

    Attributes:
        kind: the :class:`PEKind` (integrations dispatch on it).
        capabilities: the class's :class:`Capabilities` (an instance whose options change one carries its own).
        example_options: a tiny configuration (set by each registered class; the registry sweep builds it).
        pe_name: the registered name (set by :func:`~.registry.register_pe`).
    """

    kind: ClassVar[PEKind]
    capabilities: Capabilities
    example_options: ClassVar[dict[str, Any]]
    pe_name: ClassVar[str]


class CameraPE(PositionalEncoding):
    """Base of camera encodings (``plucker``, ``prope``, ``rayrope``, ``ucpe``): no grid coordinates; the inputs
    are cameras, one :class:`mmpos.camera.Cameras` value. The contract (``docs/cameras.md``)::

        geometry = pe.prepare(cameras)              # once per step; every layer shares it
        x = pe.embed_tokens(x, geometry)            # tokens [B, L, dim]: + the embedding (additive); else x
        out = pe.attention(q, k, v, geometry)       # [B, H, L, D]: SDPA with the encoding (additive: plain SDPA)
        scores = pe.logits(q, k, geometry)          # [B, H, Lq, Lk] encoded dot products, for tests and plots

    ``attention(q, k, v, query, key=None, attn_mask=None, scale=None)``: ``key`` is the key side's geometry
    (cross-attention; default ``query``). An encoding with ``capabilities.predicts_depth`` also takes the
    per-layer depth head's output, ``attention(..., depth_q=head(x))`` with ``head = cls.depth_head(dim)``.
    Subclasses implement ``_prepare(cameras)``.
    """

    kind = PEKind.CAMERA
    capabilities = Capabilities(needs_cameras=True)
    num_axes = None  # no grid coordinates: inputs are cameras (see prepare)

    def prepare(self, cameras: Cameras) -> Any:
        """``prepare(cameras)`` -> the encoding's geometry of a :class:`mmpos.camera.Cameras`."""
        if not isinstance(cameras, Cameras):
            raise TypeError(
                f"{type(self).__name__}.prepare takes one mmpos.camera.Cameras, got {type(cameras).__name__}"
            )
        return self._prepare(cameras)

    def _prepare(self, cameras: Cameras) -> Any:
        """The encoding's geometry of ``cameras`` (what ``attention`` and ``logits`` take)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _prepare(cameras)")

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        query: Any,
        key: Any = None,
        attn_mask: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """``[B, H, L, D]`` attention of ``q, k, v`` with the encoding (``query`` / ``key``: ``prepare``'s
        geometry of each side)."""
        raise NotImplementedError

    def embed_tokens(self, x: torch.Tensor, geometry: Any) -> torch.Tensor:
        """Tokens ``x [B, L, dim]`` with the encoding's additive part: unchanged for an attention encoding."""
        return x

    @classmethod
    def depth_head(cls, dim: int) -> nn.Module | None:
        """The per-layer module whose output ``attention`` takes as ``depth_q`` (``None``: no depth read)."""
        return None

    @classmethod
    def for_head_dim(cls, head_dim: int) -> CameraPE:
        """An instance with default options for attention heads of ``head_dim`` channels (what a model that
        swaps camera encodings builds; an additive encoding builds its geometry-only form)."""
        return cls(head_dim=head_dim)

    @classmethod
    def adapter_layer(
        cls,
        dim: int,
        num_heads: int,
        head_dim: int,
        use_orientation: bool = True,
        rope_theta: float = 100.0,
        qkv_bias: bool = True,
    ) -> nn.Module:
        """A zero-initialised per-layer camera adapter for a frozen host attention of width ``dim`` (only where
        ``capabilities.adapter``): a module with ``condition(cameras) -> state``, ``input_delta(x, state)`` and
        ``residual(x, state)`` (each ``None`` or ``[B, L, dim]``; see :mod:`mmpos.integrations.diffusers`)."""
        raise NotImplementedError(f"{cls.__name__} has no camera adapter (capabilities.adapter is False)")
