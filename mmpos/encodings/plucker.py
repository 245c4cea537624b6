"""``plucker``: per-token 6D Plücker rays ``(o x d, d)``, the camera input of CameraCtrl-style methods (in
CameraCtrl's channel order; ``order="direction_moment"`` for ``(d, o x d)``).

An absolute, token-level encoding: ``prepare(cameras)`` gives the raw 6 channels per token (the input of a conv
or linear camera adapter); ``embed_tokens`` adds ``proj(plucker)`` to the tokens, where ``proj = Linear(6, embed_dim)``
starts at zero (so attaching it to a pretrained model is a no-op until trained; ``zero_init=False`` for a
default-initialised projection). Not invariant to the world frame (it is absolute by design).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._validation import check_positive_int
from ..camera.cameras import Cameras
from ..camera.poses import check_pose
from ..camera.rays import PLUCKER_ORDERS, plucker_rays
from .base import CameraPE, Capabilities
from .registry import register_pe


@register_pe("plucker")
class PluckerRays(CameraPE):
    """Plücker ray embedding added to tokens ``x [B, L, embed_dim]``, ``L = C * P`` camera-major.

    The camera-encoding contract, for an additive encoding: ``rays = pe.prepare(cameras)`` gives the geometry,
    the 6D rays ``[B, C * P, 6]`` of ``cameras.c2w`` and ``cameras.rays`` (any camera model); ``pe.embed_tokens(x,
    rays)`` (also ``pe(x, rays)``) adds ``proj(rays)``; ``pe.attention`` is plain SDPA (the camera entered the
    tokens). ``embed_dim=None`` builds the geometry alone (no projection), for a model that embeds the rays
    itself (LVSM's per-patch ``Linear(6 p^2, dim)``, a conv encoder of :meth:`maps`).
    """

    description = "Plücker coordinates of each token's camera ray, embedded and added to the tokens (CameraCtrl)."

    capabilities = Capabilities(needs_cameras=True, learnable=True, additive=True, adapter=True)  # absolute
    example_options = dict(embed_dim=16, zero_init=False)  # a zero projection would hide the rays

    def __init__(self, embed_dim: int | None, zero_init: bool = True, order: str = "moment_direction"):
        super().__init__()
        if order not in PLUCKER_ORDERS:
            raise ValueError(f"order must be one of {PLUCKER_ORDERS}, got {order!r}")
        self.embed_dim, self.order = embed_dim, order
        if embed_dim is None:
            self.proj = None
            self.capabilities = dataclasses.replace(self.capabilities, learnable=False)
            return
        check_positive_int("embed_dim", embed_dim)
        self.proj = nn.Linear(6, embed_dim)
        if zero_init:
            nn.init.zeros_(self.proj.weight)
            nn.init.zeros_(self.proj.bias)

    @classmethod
    def for_head_dim(cls, head_dim: int) -> PluckerRays:
        """The geometry-only form (``embed_dim=None``): Plücker rays do not act on attention heads."""
        return cls(embed_dim=None)

    @classmethod
    def adapter_layer(
        cls,
        dim: int,
        num_heads: int | None = None,
        head_dim: int | None = None,
        use_orientation: bool = True,
        rope_theta: float = 100.0,
        qkv_bias: bool = True,
    ) -> PluckerRays:
        """CameraCtrl-style: the zero-initialised ``Linear(6, dim)`` of the rays added to the attention input."""
        return cls(dim)

    # --- geometry ---------------------------------------------------------------------------------------------
    def _prepare(self, cameras: Cameras) -> torch.Tensor:
        """``[B, C * P, 6]`` (the poses' dtype), channels ``(o x d, d)`` (CameraCtrl's ``ray_condition``) or
        ``(d, o x d)`` for ``order="direction_moment"``."""
        return _plucker(cameras.c2w, _rays_of(cameras), self.order)

    @staticmethod
    def maps(cameras: Cameras, order: str = "moment_direction") -> torch.Tensor:
        """``maps(cameras)`` -> ``[B, C, 6, rows, cols]`` Plücker images (the input of conv camera encoders;
        CameraCtrl's ``ray_condition`` permuted to channels-first)."""
        if not isinstance(cameras, Cameras):
            raise TypeError(f"PluckerRays.maps takes one mmpos.camera.Cameras, got {type(cameras).__name__}")
        rows, cols = cameras.grid
        rays = _plucker(cameras.c2w, _rays_of(cameras), order)
        return rays.unflatten(1, (cameras.num_cameras, rows, cols)).permute(0, 1, 4, 2, 3)

    # --- the additive embedding -------------------------------------------------------------------------------
    def embed_tokens(self, x: torch.Tensor, geometry: torch.Tensor) -> torch.Tensor:
        """``x [B, L, embed_dim] + proj(rays)`` with ``rays = prepare(cameras)`` ``[B, L, 6]``."""
        return x + self.input_delta(x, geometry)

    def forward(self, x: torch.Tensor, rays: torch.Tensor) -> torch.Tensor:
        """``pe(x, rays)`` (:meth:`embed_tokens`) with ``rays = pe.prepare(cameras)``."""
        return self.embed_tokens(x, rays)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        query: Any = None,
        key: Any = None,
        attn_mask: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Plain SDPA: an additive encoding leaves attention as it is (the rays entered the tokens)."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)

    def logits(self, q: torch.Tensor, k: torch.Tensor, query: Any = None, key: Any = None) -> torch.Tensor:
        """``q k^T`` (unscaled): attention itself carries no camera."""
        return q @ k.transpose(-1, -2)

    # --- the per-layer adapter protocol of mmpos.integrations.diffusers.CameraAdapter --------------------------
    def condition(self, cameras: Cameras) -> torch.Tensor:
        return self.prepare(cameras)

    def input_delta(self, x: torch.Tensor, rays: torch.Tensor) -> torch.Tensor:
        """``proj(rays)`` ``[B, L, embed_dim]``, added to the attention input (exact zeros at initialisation)."""
        if self.proj is None:
            raise ValueError("this PluckerRays was built with embed_dim=None (geometry only): it has no projection")
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"x must be [B, L, {self.embed_dim}], got {tuple(x.shape)}")
        if rays.shape[1] != x.shape[1]:
            raise ValueError(f"x has {x.shape[1]} tokens; the cameras give {rays.shape[1]} (C * P)")
        return self.proj(rays.to(x.dtype))

    def residual(self, x: torch.Tensor, rays: torch.Tensor) -> None:
        """Nothing is added to the attention output (the rays enter its input)."""
        return None


def _plucker(c2w: torch.Tensor, rays_cam: torch.Tensor, order: str) -> torch.Tensor:
    c2w = check_pose("c2w", c2w)
    if c2w.dim() != 4:
        raise ValueError(f"c2w must be [B, C, 4, 4], got {tuple(c2w.shape)}")
    if rays_cam.shape[-1] != 3 or rays_cam.dim() > 4:
        raise ValueError(f"rays_cam must be [P, 3], [C, P, 3] or [B, C, P, 3], got {tuple(rays_cam.shape)}")
    return plucker_rays(c2w, rays_cam, order).flatten(1, 2)


def _rays_of(cameras: Cameras) -> torch.Tensor:
    if cameras.rays is None:
        raise ValueError("cameras: plucker needs the patches' rays (cameras.rays; e.g. Cameras.from_models)")
    return cameras.rays
