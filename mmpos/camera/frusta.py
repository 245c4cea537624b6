"""Camera frusta as world line segments (for figures of a rig; moved from ``mmpos.viz.cameras``)."""

from __future__ import annotations

import torch

__all__ = ["frustum_lines"]


def frustum_lines(c2w: torch.Tensor, intrinsics: torch.Tensor, depth: float) -> torch.Tensor:
    """``[8, 2, 3]`` world segments of a camera's frustum (4 edges from the centre, 4 around the image plane at
    z-depth ``depth``); ``c2w [4, 4]`` (OpenCV axes); ``intrinsics``: normalised ``(fx/W, fy/H, cx/W, cy/H)``."""
    fx, fy, cx, cy = intrinsics.tolist()
    corners = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]], dtype=c2w.dtype)
    x = (corners[:, 0] - cx) / fx * depth
    y = (corners[:, 1] - cy) / fy * depth
    cam = torch.stack([x, y, torch.full_like(x, depth)], -1)
    world = cam @ c2w[:3, :3].T + c2w[:3, 3]
    centre = c2w[:3, 3].expand(4, 3)
    edges = torch.stack([centre, world], 1)
    rim = torch.stack([world, world.roll(-1, 0)], 1)
    return torch.cat([edges, rim])
