"""Rays of token patches: pixel positions, camera-frame rays, world rays and Plücker coordinates.

Patch convention: an image of ``H x W`` pixels is cut into a ``rows x cols`` grid; patch ``(r, c)`` covers
pixels ``[c W/cols, (c+1) W/cols) x [r H/rows, (r+1) H/rows)`` in the continuous pixel coordinates of
:mod:`mmpos.camera.models`. A patch's ray goes through the point ``offset = (ox, oy)`` of the patch in patch
units: ``(0.5, 0.5)`` (default) is the patch centre ``u = (c + 0.5) W / cols``; RayRoPE's three rays use
the corners ``(0, 0), (1, 0), (0, 1)``. Tokens are row-major (column fastest). UCPE's reference casts
rays at integer indices with ``cx = W/2`` (offset ``(0, 0)``): pass that offset to reproduce it.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch.types import Device

from .._validation import as_int_tuple, check_positive_int
from .base import CameraModel
from .poses import check_pose


def patch_pixels(
    grid_size: Sequence[int],
    image_size: Sequence[float],
    offset: Sequence[float] = (0.5, 0.5),
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """``[rows * cols, 2]`` pixel coordinates (u, v) of the point ``offset`` inside every patch."""
    rows, cols = as_int_tuple("grid_size", grid_size)
    check_positive_int("grid_size[0]", rows), check_positive_int("grid_size[1]", cols)
    height, width = (float(s) for s in image_size)
    if not (height > 0 and width > 0):
        raise ValueError(f"image_size must be positive (height, width), got {tuple(image_size)}")
    ox, oy = (float(o) for o in offset)
    v = (torch.arange(rows, dtype=torch.float64, device=device) + oy) * (height / rows)
    u = (torch.arange(cols, dtype=torch.float64, device=device) + ox) * (width / cols)
    vv, uu = torch.meshgrid(v, u, indexing="ij")
    return torch.stack([uu, vv], -1).reshape(-1, 2).to(dtype)


def ray_grid(
    camera: CameraModel,
    grid_size: Sequence[int],
    offset: Sequence[float] = (0.5, 0.5),
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Camera-frame unit rays of every patch: ``(rays [rows * cols, 3], valid [rows * cols])``."""
    pixels = patch_pixels(grid_size, (camera.height, camera.width), offset, dtype, device)
    return camera.unproject(pixels)


def world_rays(c2w: torch.Tensor, rays_cam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Origins and unit directions in the world: ``c2w [..., 4, 4]``, ``rays_cam [..., P, 3]`` ->
    ``(origins [..., P, 3], directions [..., P, 3])``."""
    c2w = check_pose("c2w", c2w)
    with torch.autocast(c2w.device.type, enabled=False):
        directions = rays_cam.to(c2w.device, c2w.dtype) @ c2w[..., :3, :3].transpose(-1, -2)
        origins = c2w[..., None, :3, 3].expand_as(directions)
    return origins, directions


PLUCKER_ORDERS = ("moment_direction", "direction_moment")


def plucker_rays(c2w: torch.Tensor, rays_cam: torch.Tensor, order: str = "moment_direction") -> torch.Tensor:
    """``[..., P, 6]`` Plücker coordinates of each patch ray (unit direction ``d``, camera centre ``o``), the
    per-pixel camera map of CameraCtrl and its successors.

    ``order``: ``"moment_direction"`` (default) is CameraCtrl's ``ray_condition`` order ``(o x d, d)``;
    ``"direction_moment"`` gives ``(d, o x d)`` (mmpos' order before it followed CameraCtrl's)::

        moment_direction: [mx my mz dx dy dz]     direction_moment: [dx dy dz mx my mz]
    """
    if order not in PLUCKER_ORDERS:
        raise ValueError(f"order must be one of {PLUCKER_ORDERS}, got {order!r}")
    origins, directions = world_rays(c2w, rays_cam)
    moments = torch.cross(origins, directions, dim=-1)
    halves = (moments, directions) if order == "moment_direction" else (directions, moments)
    return torch.cat(halves, -1)


def reorder_plucker_inputs(weight: torch.Tensor, source: str, target: str = "moment_direction") -> torch.Tensor:
    """The input weight ``[out, 6]`` (a ``Linear`` or a 1x1/kxk conv flattened the same way, ``[out, 6, ...]``) of
    a layer trained on Plücker rays in ``source`` order, rearranged to give the same output on rays in ``target``
    order (a permutation of the input channels; a new tensor)."""
    for name, value in (("source", source), ("target", target)):
        if value not in PLUCKER_ORDERS:
            raise ValueError(f"{name} must be one of {PLUCKER_ORDERS}, got {value!r}")
    if weight.dim() < 2 or weight.shape[1] != 6:
        raise ValueError(f"weight must be [out, 6, ...] (6 Plücker input channels), got {tuple(weight.shape)}")
    source_halves = source.split("_")
    columns = [3 * source_halves.index(half) + i for half in target.split("_") for i in range(3)]
    return weight[:, columns].clone()
