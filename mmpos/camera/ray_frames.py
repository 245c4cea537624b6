"""Per-ray local frames and the latitude/up map (UCPE's relative and absolute camera encodings).

Both work for any camera model of :mod:`mmpos.camera.models`, and both return a validity mask: rays the
model cannot produce, and rays where the frame or the up direction is undefined, are flagged instead of
yielding NaN or an arbitrary frame.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .base import CameraModel
from .poses import check_pose, invert_pose, pose_from_rotation_translation
from .rays import patch_pixels

DEGENERATE_EPS = 1e-6  # |y_cam x z| (sine of the angle between a ray and the camera's vertical axis) below it


def ray_frames(
    rays_cam: torch.Tensor, c2w: torch.Tensor, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """World-to-ray transforms: one rigid frame per ray, ``z`` along the ray, ``x`` horizontal in the camera.

    ``z = R d``, ``x = normalize(y_cam x z)`` (``y_cam``: the camera's down axis in the world), ``y = z x x``,
    origin at the camera centre. The optical-axis ray's frame is the camera's ``w2c``. A ray parallel to
    ``y_cam`` (possible beyond 180 degrees) takes ``x`` from the camera's x axis instead and is flagged; an
    invalid ray (``valid`` False, a zero ray, a NaN or inf component) gets the camera's own frame and is flagged.

    Args:
        rays_cam: ``[..., P, 3]`` unit rays in the camera frame; c2w: ``[..., 4, 4]``; valid: ``[..., P]``.
    Returns:
        ``(w2l [..., P, 4, 4], ok [..., P] bool)``.
    """
    c2w = check_pose("c2w", c2w)
    with torch.autocast(c2w.device.type, enabled=False):
        rays = rays_cam.to(c2w.device, c2w.dtype)
        usable = torch.isfinite(rays).all(-1) & (rays.norm(dim=-1) > DEGENERATE_EPS)  # NaN or zero rays: flagged
        if valid is not None:
            usable = usable & valid
        axis = torch.zeros_like(rays)
        axis[..., 2] = 1
        rays = torch.where(usable[..., None], rays, axis)
        rotation = c2w[..., None, :3, :3]  # [..., 1, 3, 3]
        z = (rotation @ rays[..., None])[..., 0]
        z = z / z.norm(dim=-1, keepdim=True)
        cam_x, cam_y = rotation[..., 0].expand_as(z), rotation[..., 1].expand_as(z)
        x = torch.cross(cam_y, z, dim=-1)
        sine = x.norm(dim=-1, keepdim=True)
        degenerate = sine[..., 0] < DEGENERATE_EPS
        fallback = cam_x - (cam_x * z).sum(-1, keepdim=True) * z
        x = torch.where(degenerate[..., None], fallback, x)
        x = x / x.norm(dim=-1, keepdim=True)
        y = torch.cross(z, x, dim=-1)
        w2l_rotation = torch.stack([x, y, z], dim=-2)  # rows
        center = c2w[..., None, :3, 3].expand_as(z)
        w2l = pose_from_rotation_translation(w2l_rotation, -(w2l_rotation @ center[..., None])[..., 0])
    ok = usable & ~degenerate
    return w2l, ok


def latitude_up_map(
    camera: CameraModel,
    c2w: torch.Tensor,
    grid_size: Sequence[int],
    offset: Sequence[float] = (0.5, 0.5),
    world_up: Sequence[float] = (0.0, -1.0, 0.0),
    step: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """UCPE's absolute orientation map ``[..., P, 3]``: ``(up_x, up_y, latitude)`` per patch.

    ``latitude = asin(d_w . up)`` of the world ray ``d_w``; ``(up_x, up_y)`` is the unit image direction (in
    patch units, y down) in which a point moves when its ray turns by ``step`` radians towards ``world_up``
    (default ``-y``: the y-down world of OpenCV/RealEstate10K). Translation and rotation about ``world_up``
    (yaw) do not change the map; pitch and roll do. Entries whose ray is invalid, points straight up or
    down, or whose turned ray leaves the model's domain are 0 and flagged.

    Args: camera: a camera model; c2w: ``[..., 4, 4]``; grid_size: ``(rows, cols)``.
    Returns: ``(map [..., P, 3], valid [..., P])``.
    """
    c2w = check_pose("c2w", c2w)
    rows, cols = grid_size
    with torch.autocast(c2w.device.type, enabled=False):
        pixels = patch_pixels(grid_size, (camera.height, camera.width), offset, c2w.dtype, c2w.device)
        rays, valid = camera.unproject(pixels)
        rotation = c2w[..., None, :3, :3]
        d = (rotation @ rays[..., None])[..., 0]  # [..., P, 3] world directions
        up = torch.as_tensor(world_up, dtype=c2w.dtype, device=c2w.device)
        up = up / up.norm()
        sine = (d * up).sum(-1).clamp(-1, 1)
        toward_up = up - sine[..., None] * d  # tangent towards up, length cos(latitude)
        cosine = toward_up.norm(dim=-1)
        latitude = torch.atan2(sine, cosine)
        flat = cosine > DEGENERATE_EPS
        tangent = toward_up / cosine.clamp_min(DEGENERATE_EPS)[..., None]
        turned = d * math.cos(step) + tangent * math.sin(step)
        turned_cam = (rotation.transpose(-1, -2) @ turned[..., None])[..., 0]
        moved, moved_ok = camera.project(turned_cam)
        start, start_ok = camera.project(rays.expand_as(turned_cam))
        scale = torch.tensor([cols / camera.width, rows / camera.height], dtype=d.dtype, device=d.device)
        shift = (moved - start) * scale
        length = shift.norm(dim=-1)
        ok = valid & flat & moved_ok & start_ok & (length > 0)
        up2d = shift / length.clamp_min(1e-30)[..., None]
        out = torch.cat([up2d, latitude[..., None]], -1)
        out = torch.where(ok[..., None], out, torch.zeros_like(out))
    return out, ok


def relative_transforms(w2l_query: torch.Tensor, w2l_key: torch.Tensor) -> torch.Tensor:
    """``T_q T_k^-1`` for every (query, key) pair: ``[..., Lq, 4, 4]``, ``[..., Lk, 4, 4]`` ->
    ``[..., Lq, Lk, 4, 4]`` (the quantity UCPE's logits depend on; for tests and plots)."""
    return w2l_query[..., :, None, :, :] @ invert_pose(w2l_key)[..., None, :, :, :]
