"""RayRoPE's rays and depths: per-camera ray geometry (:class:`RaySide`), the per-layer depth head and the depth
hypotheses it predicts, and known depths sampled from depth maps (RGB-D views). See :mod:`.rayrope`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from .._validation import as_int_tuple, check_choice, check_finite
from ..camera.models import check_intrinsic_matrix, normalized_intrinsics
from ..camera.poses import check_pose, invert_pose
from ..camera.rays import patch_pixels

RAY_OFFSETS = {1: ((0.5, 0.5),), 2: ((0.0, 0.0), (1.0, 1.0)), 3: ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0))}
DEPTH_RANGE = (1e-2, 100.0)
MAX_LOG_DEPTH = 3.0


@dataclass(eq=False)
class RaySide:
    """Geometry of the cameras on one side of the attention (``C`` cameras, ``P`` patches, ``R`` rays each).

    w2c ``[B, C, 4, 4]``; k_norm ``[B, C, 3, 3]`` (normalised intrinsics); centers ``[B, C, 3]`` (world);
    ray_steps ``[B, C, P, R, 3]``: world displacement per unit of z-depth along each ray; own_dirs ``[P, R, 2]``:
    each ray's direction code in its own camera (``normalize(u, v, 1)[:2]``, independent of depth and K);
    known_depth ``[B, L_known, R]`` or ``None``: known z-depths of the first tokens (from ``Cameras.depth``), the
    default of ``attention``'s ``known_depth_q`` / ``known_depth_k`` for this side.
    """

    w2c: torch.Tensor
    k_norm: torch.Tensor
    centers: torch.Tensor
    ray_steps: torch.Tensor
    own_dirs: torch.Tensor
    known_depth: torch.Tensor | None = None

    @property
    def num_cameras(self) -> int:
        return self.w2c.shape[1]

    @property
    def patches(self) -> int:
        return self.ray_steps.shape[2]

    @property
    def num_tokens(self) -> int:
        return self.num_cameras * self.patches


class RayDepthHead(nn.Linear):
    """Per-layer depth head ``Linear(dim, 2)`` -> raw ``(log_depth, sigma)`` per token, shared by the heads.

    Initialised as the reference: zero weights and bias ``(init_depth, init_sigma) = (0, 3)``, so every token
    starts with depths ``[e^-3, e^3]``. Tip: exclude it from weight decay, which would pull the bias to 0.
    """

    def __init__(self, dim: int, init_depth: float = 0.0, init_sigma: float = 3.0):
        super().__init__(dim, 2)
        nn.init.zeros_(self.weight)
        with torch.no_grad():
            self.bias.copy_(torch.tensor([init_depth, init_sigma]))


def ray_side(
    w2c: torch.Tensor, intrinsics: torch.Tensor, image_size: Sequence[float], grid_size: Sequence[int], num_rays: int
) -> RaySide:
    """Geometry of ``C`` cameras: ``w2c [B, C, 4, 4]``, pixel ``intrinsics [B, C, 3, 3]`` of ``image_size = (H, W)``
    images cut into ``grid_size = (rows, cols)`` patches, ``num_rays`` rays per patch (:data:`RAY_OFFSETS`)."""
    w2c = check_pose("w2c", w2c)
    if w2c.dim() != 4:
        raise ValueError(f"w2c must be [B, C, 4, 4], got {tuple(w2c.shape)}")
    check_intrinsic_matrix("intrinsics", intrinsics)
    if intrinsics.shape[:-2] != w2c.shape[:-2]:
        raise ValueError(f"intrinsics {tuple(intrinsics.shape)} must be [B, C, 3, 3] like w2c {tuple(w2c.shape)}")
    rows, cols = as_int_tuple("grid_size", grid_size)
    with torch.autocast(w2c.device.type, enabled=False):
        dtype, device = w2c.dtype, w2c.device
        pixels = torch.stack(
            [patch_pixels((rows, cols), image_size, o, dtype, device) for o in RAY_OFFSETS[num_rays]], dim=1
        )  # [P, R, 2]
        homogeneous = torch.cat([pixels, torch.ones_like(pixels[..., :1])], -1)
        k_inv = torch.linalg.inv(intrinsics.to(dtype))  # [B, C, 3, 3]
        c2w = invert_pose(w2c)
        cam_steps = homogeneous @ k_inv[:, :, None].transpose(-1, -2)  # [B, C, P, R, 3], z = 1
        ray_steps = cam_steps @ c2w[:, :, None, :3, :3].transpose(-1, -2)
        height, width = (float(s) for s in image_size)
        image = torch.stack(
            [pixels[..., 0] / width - 0.5, pixels[..., 1] / height - 0.5, torch.ones_like(pixels[..., 0])], -1
        )
        own_dirs = (image / image.norm(dim=-1, keepdim=True))[..., :2]
        return RaySide(
            w2c, normalized_intrinsics(intrinsics.to(dtype), image_size), c2w[..., :3, 3], ray_steps, own_dirs
        )


def depth_hypotheses(
    raw: torch.Tensor | None,
    side: RaySide,
    num_rays: int,
    known: torch.Tensor | None = None,
    names: tuple[str, str] = ("raw", "known"),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depth hypotheses ``(d1, d2)`` ``[B, L, R]`` from the depth head's raw ``(l, s)`` ``[B, L, 2]``: the depths
    ``exp(min(l -+ s, 3))``, clamped to :data:`DEPTH_RANGE`.

    ``known [B, L_known, R]`` (e.g. :func:`sample_ray_depths`) replaces both for the first ``L_known`` tokens
    (RGB-D context views). ``raw=None`` with ``known`` covering every token is allowed. NaN or inf in either is
    refused (``names``: the arguments' names in the message): one would turn every attention output to NaN.
    """
    batch, length = side.w2c.shape[0], side.num_tokens
    dtype, device = side.w2c.dtype, side.w2c.device
    if raw is None:
        if known is None or known.shape[1] != length:
            raise ValueError(
                f"raw depth predictions [B, {length}, 2] are required unless known depths cover every token"
            )
        d1 = d2 = torch.empty(batch, 0, num_rays, dtype=dtype, device=device)
    else:
        if raw.dim() != 3 or raw.shape[1:] != (length, 2):
            raise ValueError(
                f"raw depth predictions must be [B, {length}, 2] (log_depth, sigma), got {tuple(raw.shape)}"
            )
        check_finite(names[0], raw)
        with torch.autocast(device.type, enabled=False):
            log_depth, sigma = raw.to(device, dtype).unbind(-1)
            d1 = (log_depth - sigma).clamp(max=MAX_LOG_DEPTH).exp()[..., None].expand(-1, -1, num_rays)
            d2 = (log_depth + sigma).clamp(max=MAX_LOG_DEPTH).exp()[..., None].expand(-1, -1, num_rays)
    if known is not None:
        if known.dim() != 3 or known.shape[-1] != num_rays or known.shape[1] > length:
            raise ValueError(f"known depths must be [B, L_known <= {length}, R={num_rays}], got {tuple(known.shape)}")
        check_finite(names[1], known)
        known = known.to(device, dtype).expand(batch, -1, -1)
        n = known.shape[1]
        d1 = torch.cat([known, d1[:, n:]], 1)
        d2 = torch.cat([known, d2[:, n:]], 1)
    return d1.clamp(*DEPTH_RANGE), d2.clamp(*DEPTH_RANGE)


def sample_ray_depths(depth_maps: torch.Tensor, grid_size: Sequence[int], num_rays: int = 3) -> torch.Tensor:
    """Known z-depths at each patch's ray points: ``depth_maps [B, C, H, W]`` -> ``[B, C * P, R]``.

    Nearest pixel containing the ray point (corners sit on pixel boundaries and take the pixel right/below),
    clamped to the image border.
    """
    if depth_maps.dim() != 4:
        raise ValueError(f"depth_maps must be [B, C, H, W], got {tuple(depth_maps.shape)}")
    check_choice("num_rays", num_rays, tuple(RAY_OFFSETS))
    height, width = depth_maps.shape[-2:]
    pixels = torch.stack(
        [patch_pixels(grid_size, (height, width), o, torch.float64, depth_maps.device) for o in RAY_OFFSETS[num_rays]],
        dim=1,
    )  # [P, R, 2]
    col = pixels[..., 0].floor().long().clamp(0, width - 1)
    row = pixels[..., 1].floor().long().clamp(0, height - 1)
    return depth_maps[:, :, row, col].flatten(1, 2)
