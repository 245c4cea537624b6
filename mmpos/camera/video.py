"""Cameras of a video's latent frames on a video transformer's patch grid: the input of the camera adapters
(moved from ``mmpos.integrations.diffusers.video_cameras``; pure geometry).

A video of ``4k + 1`` frames has ``k + 1`` latent frames (Wan's VAE compresses time by 4, keeping the first
frame), each cut into ``rows x cols`` patches (``height / 16 x width / 16`` for Wan). A camera path of any length is
resampled to the latent frame count (rotations along the geodesic, centres and intrinsics linearly), and its
intrinsics are scaled to the output size. Tokens are frame-major, row-major inside a frame, as the transformer
flattens its patches.

    cameras = video_cameras(preset_trajectory("orbit", 49), grid=(13, 30, 52), image_size=(480, 832))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch
from torch.types import Device

from .base import CameraModel
from .cameras import Cameras
from .perspective import is_linear_projection
from .poses import check_pose
from .ray_frames import latitude_up_map
from .rays import ray_grid
from .trajectory import Trajectory, resample

__all__ = ["CameraPath", "VideoCameras", "stack_cameras", "video_cameras"]


@dataclass(eq=False)
class CameraPath:
    """Poses and camera model(s) of a path: ``c2w [N, 4, 4]`` (OpenCV axes) and one :class:`CameraModel`
    (pinhole, OpenCV, Kannala-Brandt fisheye, unified, equirectangular) for every frame, or a list of ``N``.
    The models' own image size is their reference: they are resized to the output size."""

    c2w: torch.Tensor
    models: Union[CameraModel, Sequence[CameraModel]]


CameraInput = Union[Trajectory, CameraPath, tuple]


@dataclass(eq=False)
class VideoCameras:
    """Per-frame cameras at the patch grid (fp32, or fp64 when asked).

    c2w: ``[1, F, 4, 4]``; rays: ``[1, F, P, 3]`` unit camera-frame rays through the patch centres; valid:
    ``[1, F, P]``; intrinsics: ``[1, F, 3, 3]`` pixel K, or ``None`` when a model has none (equirectangular);
    orientation: ``[1, F * P, 3]`` UCPE's latitude/up map; grid: ``(F, rows, cols)``; image_size: ``(H, W)``.
    The leading 1 broadcasts over the batch; :func:`stack_cameras` makes a batch of different cameras.
    """

    c2w: torch.Tensor
    rays: torch.Tensor
    valid: torch.Tensor
    intrinsics: torch.Tensor | None
    orientation: torch.Tensor
    grid: tuple
    image_size: tuple

    @property
    def num_tokens(self) -> int:
        frames, rows, cols = self.grid
        return frames * rows * cols

    @property
    def cameras(self) -> Cameras:
        """The same cameras as the :class:`~.cameras.Cameras` every camera encoding's ``prepare`` takes."""
        return Cameras(
            c2w=self.c2w,
            grid=self.grid[1:],
            image_size=self.image_size,
            intrinsics=self.intrinsics,
            rays=self.rays,
            valid=self.valid,
            orientation=self.orientation,
        )


def video_cameras(
    camera: CameraInput,
    grid: Sequence[int],
    image_size: Sequence[int],
    dtype: torch.dtype = torch.float32,
    device: Device = None,
    offset: Sequence[float] = (0.5, 0.5),
) -> VideoCameras:
    """Resample ``camera`` to ``grid[0]`` latent frames and describe it at the ``(rows, cols)`` patch grid.

    Args:
        camera: an :class:`~mmpos.camera.Trajectory` (pinhole intrinsics normalised by the image size), a
            :class:`CameraPath`, or a tuple ``(c2w [N, 4, 4], model or models)``.
        grid: ``(latent frames, rows, cols)``; image_size: output ``(height, width)`` in pixels.
        offset: where each patch's ray passes, in patch units from its top-left corner (``(0.5, 0.5)``: the
            centre; UCPE's released models used ``(0, 0)``, see ``CameraAdapter``'s ``ray_offset``).
    Raises:
        ValueError naming ``camera`` for non-finite or non-rigid poses, invalid intrinsics, or a frame without a
        single valid ray.
    """
    frames, rows, cols = (int(g) for g in grid)
    height, width = (int(s) for s in image_size)
    c2w, models = _poses_and_models(camera, frames)
    models = [_resized(m, width, height, i) for i, m in enumerate(models)]
    offset = tuple(float(o) for o in offset)
    per_frame = [ray_grid(m, (rows, cols), offset, dtype=torch.float64) for m in models]
    rays, valid = torch.stack([r for r, _ in per_frame]), torch.stack([v for _, v in per_frame])
    for i in range(frames):
        if not bool(valid[i].any()) or not bool(torch.isfinite(rays[i][valid[i]]).all()):
            raise ValueError(
                f"camera: frame {i} (after resampling to {frames} latent frames) has no valid ray on "
                f"the {rows}x{cols} patch grid; expected intrinsics that image the {width}x{height} "
                "output"
            )
    orientation = torch.stack([latitude_up_map(m, c2w[i], (rows, cols), offset)[0] for i, m in enumerate(models)])
    linear = [m for m in models if is_linear_projection(m)]
    intrinsics = None
    if len(linear) == len(models):
        intrinsics = torch.stack([m.intrinsic_matrix(torch.float64) for m in linear])

    def put(t: torch.Tensor) -> torch.Tensor:
        return t[None].to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

    return VideoCameras(
        put(c2w),
        put(rays),
        put(valid),
        None if intrinsics is None else put(intrinsics),
        put(orientation.flatten(0, 1)),
        (frames, rows, cols),
        (height, width),
    )


def stack_cameras(items: Sequence[VideoCameras]) -> VideoCameras:
    """A batch ``[B, ...]`` of cameras on the same grid (training: one path per sample)."""
    first = items[0]
    if any(c.grid != first.grid or c.image_size != first.image_size for c in items):
        raise ValueError("cameras: every item must have the same grid and image size")
    given = [c.intrinsics for c in items if c.intrinsics is not None]
    intrinsics = torch.cat(given) if len(given) == len(items) else None
    return VideoCameras(
        torch.cat([c.c2w for c in items]),
        torch.cat([c.rays for c in items]),
        torch.cat([c.valid for c in items]),
        intrinsics,
        torch.cat([c.orientation for c in items]),
        first.grid,
        first.image_size,
    )


def _poses_and_models(camera: CameraInput, frames: int) -> tuple[torch.Tensor, list[CameraModel]]:
    """``(c2w [frames, 4, 4] fp64, one model per frame)`` of ``camera`` resampled to ``frames``."""
    if isinstance(camera, tuple) and len(camera) == 2:
        camera = CameraPath(*camera)
    if isinstance(camera, Trajectory):
        _checked_poses(camera.c2w)
        _check_finite_intrinsics(camera.intrinsics)
        path = resample(camera, frames)
        return path.c2w.double(), [path.camera(i, 1.0, 1.0) for i in range(frames)]
    if not isinstance(camera, CameraPath):
        raise TypeError(
            f"camera must be a mmpos.camera.Trajectory, a CameraPath or a (c2w, model) tuple, got "
            f"{type(camera).__name__}"
        )
    c2w = _checked_poses(torch.as_tensor(camera.c2w).double())
    given = camera.models
    models = [given] * c2w.shape[0] if isinstance(given, CameraModel) else list(given)
    if len(models) != c2w.shape[0] or not all(isinstance(m, CameraModel) for m in models):
        raise ValueError(
            f"camera: expected one CameraModel or a list of {c2w.shape[0]} (one per pose), got {len(models)} item(s)"
        )
    dummy = torch.tensor([[1.0, 1.0, 0.5, 0.5]], dtype=torch.float64).expand(c2w.shape[0], 4)
    path = resample(Trajectory(c2w, dummy), frames)
    nearest = torch.linspace(0, len(models) - 1, frames).round().long().tolist()
    return path.c2w, [models[i] for i in nearest]


def _checked_poses(c2w: torch.Tensor) -> torch.Tensor:
    try:
        c2w = check_pose("camera c2w", c2w)
    except ValueError as error:
        raise ValueError(f"camera: {error}") from None
    if c2w.dim() != 3 or len(c2w) == 0:
        raise ValueError(f"camera: c2w must be [N >= 1, 4, 4], got {tuple(c2w.shape)}")
    return c2w


def _check_finite_intrinsics(intrinsics: torch.Tensor) -> None:
    if not bool(torch.isfinite(intrinsics).all()) or not bool((intrinsics[:, :2] > 0).all()):
        raise ValueError("camera: intrinsics must be finite with positive focal lengths (fx/W, fy/H, cx/W, cy/H)")


def _resized(model: CameraModel, width: int, height: int, frame: int) -> CameraModel:
    try:
        return model.resized(width, height)
    except ValueError as error:
        raise ValueError(f"camera: frame {frame}: {error}") from None
