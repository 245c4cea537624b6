"""``plucker``: per-token 6D Plücker rays ``(o x d, d)``, the camera input of CameraCtrl-style methods (in
CameraCtrl's channel order; ``order="direction_moment"`` for ``(d, o x d)``).

An absolute, token-level encoding: ``embed`` gives the raw 6 channels per token (the input of a conv or
linear camera adapter); ``forward`` adds ``proj(plucker)`` to the tokens, where ``proj = Linear(6, embed_dim)``
starts at zero (so attaching it to a pretrained model is a no-op until trained; ``zero_init=False`` for a
default-initialised projection). Not invariant to the world frame (it is absolute by design).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .._validation import as_int_tuple, check_positive_int
from ..camera.poses import check_pose
from ..camera.rays import PLUCKER_ORDERS, plucker_rays
from .base import Capabilities, CameraPE
from .registry import register_pe


@register_pe("plucker")
class PluckerRays(CameraPE):
    """Plücker ray embedding added to tokens ``x [B, L, embed_dim]``, ``L = C * P`` camera-major."""

    description = "Plücker coordinates of each token's camera ray, embedded and added to the tokens (CameraCtrl)."

    capabilities = Capabilities(needs_cameras=True, learnable=True)  # absolute: not world-frame invariant
    example_options = dict(embed_dim=16, zero_init=False)  # a zero projection would hide the rays

    def __init__(self, embed_dim: int, zero_init: bool = True, order: str = "moment_direction"):
        super().__init__()
        check_positive_int("embed_dim", embed_dim)
        if order not in PLUCKER_ORDERS:
            raise ValueError(f"order must be one of {PLUCKER_ORDERS}, got {order!r}")
        self.embed_dim, self.order = embed_dim, order
        self.proj = nn.Linear(6, embed_dim)
        if zero_init:
            nn.init.zeros_(self.proj.weight)
            nn.init.zeros_(self.proj.bias)

    @staticmethod
    def embed(c2w: torch.Tensor, rays_cam: torch.Tensor, order: str = "moment_direction") -> torch.Tensor:
        """``c2w [B, C, 4, 4]``, ``rays_cam [P, 3] | [C, P, 3] | [B, C, P, 3]`` -> ``[B, C * P, 6]`` (fp32/64),
        channels ``(o x d, d)`` (CameraCtrl's ``ray_condition``) or ``(d, o x d)`` for ``"direction_moment"``."""
        c2w = check_pose("c2w", c2w)
        if c2w.dim() != 4:
            raise ValueError(f"c2w must be [B, C, 4, 4], got {tuple(c2w.shape)}")
        if rays_cam.shape[-1] != 3 or rays_cam.dim() > 4:
            raise ValueError(f"rays_cam must be [P, 3], [C, P, 3] or [B, C, P, 3], got {tuple(rays_cam.shape)}")
        return plucker_rays(c2w, rays_cam, order).flatten(1, 2)

    @staticmethod
    def maps(c2w: torch.Tensor, rays_cam: torch.Tensor, grid_size: Sequence[int],
             order: str = "moment_direction") -> torch.Tensor:
        """``[B, C, 6, rows, cols]`` Plücker images (the input of conv camera encoders; CameraCtrl's
        ``ray_condition`` permuted to channels-first)."""
        rows, cols = as_int_tuple("grid_size", grid_size)
        rays = PluckerRays.embed(c2w, rays_cam, order)
        return rays.unflatten(1, (c2w.shape[1], rows, cols)).permute(0, 1, 4, 2, 3)

    def forward(self, x: torch.Tensor, c2w: torch.Tensor, rays_cam: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"x must be [B, L, {self.embed_dim}], got {tuple(x.shape)}")
        rays = self.embed(c2w, rays_cam, self.order)
        if rays.shape[1] != x.shape[1]:
            raise ValueError(f"x has {x.shape[1]} tokens; the cameras give {rays.shape[1]} (C * P)")
        return x + self.proj(rays.to(x.dtype))
