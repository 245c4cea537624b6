"""``Cameras``: the one input of every camera encoding (``geometry = pe.prepare(cameras)``).

One value holds what any camera encoding reads, in one convention:

- poses in OpenCV camera axes (x right, y down, z forward); the canonical form is world-to-camera ``w2c
  [B, C, 4, 4]`` and ``c2w`` is its rigid inverse. The form the value was built from is kept bit for bit and the
  other is derived once with :func:`~.poses.invert_pose` (so an encoding that reads ``c2w`` and one that reads
  ``w2c`` each see exactly what a caller holding that form would have passed);
- the image grid: ``grid = (rows, cols)`` patches per image (``P = rows * cols`` tokens per camera, tokens
  camera-major, row-major inside an image) and ``image_size = (H, W)`` in pixels;
- the camera model's output at the grid, for any model of :mod:`mmpos.camera` (pinhole, OpenCV, fisheye,
  unified, panorama): ``rays`` (unit camera-frame rays through each patch's ray point) and their ``valid`` mask,
  and ``intrinsics`` (pixel ``K``) when the model has them (``None`` for a panorama);
- optional extras: ``depth`` (z-depth maps of the first views, RGB-D) and ``orientation`` (UCPE's
  latitude/up map).

Construction validates: shapes are named, poses must be finite and rigid (a non-orthonormal rotation is refused
by name), intrinsics finite with positive focal lengths. Converters: :meth:`Cameras.from_models` (camera models,
any lens), :meth:`Cameras.from_pinhole` (``K`` + image size), :meth:`Cameras.from_opengl` (OpenGL / Blender /
NeRF camera-to-world), :meth:`Cameras.from_trajectory` (a :class:`~.trajectory.Trajectory`).
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import torch
from torch.types import Device

from .._validation import as_int_tuple, check_finite_number, check_float_coords, check_positive_int
from .base import CameraModel
from .intrinsics import check_intrinsic_matrix
from .perspective import is_linear_projection
from .poses import check_pose, invert_pose, opengl_to_opencv
from .ray_frames import latitude_up_map
from .rays import patch_pixels, ray_grid
from .trajectory import Trajectory

__all__ = ["Cameras"]

Models = Union[CameraModel, Sequence[CameraModel]]


class Cameras:
    """``C`` cameras (views, or a video's frames) of a batch of ``B`` on one patch grid.

    Args (keyword only; exactly one of ``w2c`` / ``c2w``):
        w2c, c2w: ``[B, C, 4, 4]`` (or ``[B, C, 3, 4]``) world-to-camera / camera-to-world, OpenCV axes,
            float32/float64.
        grid: ``(rows, cols)`` patches per image.
        image_size: ``(H, W)`` pixels (needed by encodings that read intrinsics).
        intrinsics: ``[B, C, 3, 3]`` pixel ``K`` of ``image_size`` images, or ``None``.
        rays: ``[P, 3]``, ``[C, P, 3]`` or ``[B, C, P, 3]`` unit camera-frame rays of the patches (``P = rows *
            cols``), e.g. :func:`~.rays.ray_grid`; non-finite rays are allowed (encodings flag them invalid).
        valid: the rays' validity, bool, broadcastable to ``[B, C, P]``.
        depth: ``[B, C_known <= C, H', W']`` z-depth maps of the first ``C_known`` cameras (known depth, RGB-D).
        orientation: ``[B or 1, C * P, 3]`` UCPE's latitude/up map (:func:`~.ray_frames.latitude_up_map`).
    """

    def __init__(
        self,
        *,
        w2c: torch.Tensor | None = None,
        c2w: torch.Tensor | None = None,
        grid: Sequence[int],
        image_size: Sequence[float] | None = None,
        intrinsics: torch.Tensor | None = None,
        rays: torch.Tensor | None = None,
        valid: torch.Tensor | None = None,
        depth: torch.Tensor | None = None,
        orientation: torch.Tensor | None = None,
    ):
        if (w2c is None) == (c2w is None):
            raise ValueError(
                "Cameras: pass exactly one of w2c (world-to-camera) or c2w (camera-to-world); the other is derived"
            )
        self._given = "w2c" if w2c is not None else "c2w"
        pose = _checked_pose(self._given, w2c if w2c is not None else c2w)
        self._given_pose = pose
        self._w2c: torch.Tensor | None = pose if w2c is not None else None
        self._c2w: torch.Tensor | None = None if w2c is not None else pose
        rows, cols = as_int_tuple("grid", grid)
        check_positive_int("grid[0] (rows)", rows), check_positive_int("grid[1] (cols)", cols)
        self.grid = (rows, cols)
        self.image_size = None if image_size is None else _checked_size(image_size)
        self.intrinsics = self._checked_intrinsics(intrinsics)
        self.rays, self.valid = self._checked_rays(rays, valid)
        self.depth = self._checked_depth(depth)
        self.orientation = self._checked_orientation(orientation)

    # --- the pose, in both forms ----------------------------------------------------------------------------
    @property
    def w2c(self) -> torch.Tensor:
        """``[B, C, 4, 4]`` world-to-camera (OpenCV axes)."""
        if self._w2c is None:
            self._w2c = invert_pose(self._given_pose)  # the c2w given
        return self._w2c

    @property
    def c2w(self) -> torch.Tensor:
        """``[B, C, 4, 4]`` camera-to-world (OpenCV axes), the rigid inverse of :attr:`w2c`."""
        if self._c2w is None:
            self._c2w = invert_pose(self._given_pose)  # the w2c given
        return self._c2w

    @property
    def _pose(self) -> torch.Tensor:
        return self._given_pose

    @property
    def batch_size(self) -> int:
        return self._pose.shape[0]

    @property
    def num_cameras(self) -> int:
        return self._pose.shape[1]

    @property
    def patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_tokens(self) -> int:
        return self.num_cameras * self.patches

    @property
    def dtype(self) -> torch.dtype:
        return self._pose.dtype

    @property
    def device(self) -> torch.device:
        return self._pose.device

    # --- converters -----------------------------------------------------------------------------------------
    @classmethod
    def from_models(
        cls,
        models: Models,
        grid: Sequence[int],
        *,
        w2c: torch.Tensor | None = None,
        c2w: torch.Tensor | None = None,
        offset: Sequence[float] = (0.5, 0.5),
        depth: torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> Cameras:
        """Cameras seen through camera models: one :class:`~.base.CameraModel` for every camera or a list of
        ``C`` (any lens; all imaging ``H x W`` images). Rays pass through the point ``offset`` of each patch
        (the centre by default); ``intrinsics`` are the models' ``K`` when every model has one; ``orientation``
        is computed. ``dtype``: of the geometry (default the pose's)."""
        pose = w2c if w2c is not None else c2w
        if not isinstance(pose, torch.Tensor) or pose.dim() != 4:
            raise ValueError(
                f"Cameras.from_models: pass w2c= or c2w= as [B, C, 4, 4], got "
                f"{None if pose is None else tuple(pose.shape)}"
            )
        models = _per_camera(models, pose.shape[1])
        size = (models[0].height, models[0].width)
        if any((m.height, m.width) != size for m in models):
            raise ValueError(
                f"Cameras.from_models: every model must image the same size; got "
                f"{sorted({(m.height, m.width) for m in models})} (H, W)"
            )
        dtype = pose.dtype if dtype is None else dtype
        pose = pose.to(dtype)
        device = pose.device
        rays, valid = (torch.stack(t, 0) for t in zip(*(ray_grid(m, grid, offset, dtype, device) for m in models)))
        intrinsics = None
        linear = [m for m in models if is_linear_projection(m)]
        if len(linear) == len(models):
            k = torch.stack([m.intrinsic_matrix(dtype, device) for m in linear])
            intrinsics = k.expand(pose.shape[0], -1, -1, -1)
        poses = {"w2c": pose} if w2c is not None else {"c2w": pose}
        cameras = cls(**poses, grid=grid, image_size=size, intrinsics=intrinsics, rays=rays, valid=valid, depth=depth)
        orientation = torch.stack(
            [latitude_up_map(m, cameras.c2w[:, i], grid, offset)[0] for i, m in enumerate(models)], 1
        ).flatten(1, 2)
        cameras.orientation = cameras._checked_orientation(orientation)
        return cameras

    @classmethod
    def from_pinhole(
        cls,
        intrinsics: torch.Tensor,
        image_size: Sequence[float],
        grid: Sequence[int],
        *,
        w2c: torch.Tensor | None = None,
        c2w: torch.Tensor | None = None,
        offset: Sequence[float] = (0.5, 0.5),
        depth: torch.Tensor | None = None,
    ) -> Cameras:
        """Pinhole cameras from pixel ``K [B, C, 3, 3]`` of ``image_size = (H, W)`` images: rays ``K^-1 (u, v,
        1)`` normalised, through the point ``offset`` of each patch (every ray valid)."""
        check_intrinsic_matrix("intrinsics", intrinsics)
        pixels = patch_pixels(grid, image_size, offset, intrinsics.dtype, intrinsics.device)
        homogeneous = torch.cat([pixels, torch.ones_like(pixels[..., :1])], -1)  # [P, 3]
        rays = homogeneous @ torch.linalg.inv(intrinsics).transpose(-1, -2)  # [B, C, P, 3]
        rays = rays / rays.norm(dim=-1, keepdim=True)
        return cls(w2c=w2c, c2w=c2w, grid=grid, image_size=image_size, intrinsics=intrinsics, rays=rays, depth=depth)

    @classmethod
    def from_opengl(cls, c2w_gl: torch.Tensor, **fields: Any) -> Cameras:
        """From OpenGL / Blender / NeRF camera-to-world (x right, y up, looking down -z); ``fields`` as the
        constructor (``grid``, ``image_size``, ``intrinsics``, ``rays`` in OpenCV camera axes, ...)."""
        check_float_coords("c2w_gl", c2w_gl)
        return cls(c2w=opengl_to_opencv(c2w_gl), **fields)

    from_blender = from_opengl

    @classmethod
    def from_trajectory(
        cls,
        trajectory: Trajectory,
        grid: Sequence[int],
        image_size: Sequence[int],
        *,
        offset: Sequence[float] = (0.5, 0.5),
        depth: torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> Cameras:
        """One sample (``B = 1``) of the :class:`~.trajectory.Trajectory`'s frames as pinhole cameras imaging
        ``image_size = (H, W)``."""
        height, width = _checked_size(image_size)
        models = [trajectory.camera(i, width, height) for i in range(len(trajectory))]
        dtype = trajectory.c2w.dtype if dtype is None else dtype
        return cls.from_models(models, grid, c2w=trajectory.c2w.to(dtype)[None], offset=offset, depth=depth)

    def to(self, device: Device = None, dtype: torch.dtype | None = None) -> Cameras:
        """The same cameras on ``device`` / in ``dtype`` (floating fields; the given pose form is converted and the
        other re-derived)."""

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            return t.to(device=device, dtype=dtype if (dtype is not None and t.is_floating_point()) else t.dtype)

        pose = {self._given: move(self._pose)}
        return Cameras(
            **pose,
            grid=self.grid,
            image_size=self.image_size,
            intrinsics=move(self.intrinsics),
            rays=move(self.rays),
            valid=move(self.valid),
            depth=move(self.depth),
            orientation=move(self.orientation),
        )

    def __repr__(self) -> str:
        extras = [name for name in ("intrinsics", "rays", "depth", "orientation") if getattr(self, name) is not None]
        return (
            f"Cameras(B={self.batch_size}, C={self.num_cameras}, grid={self.grid}, image_size={self.image_size}, "
            f"{self.dtype}, with {extras})"
        )

    # --- validation -----------------------------------------------------------------------------------------
    def _checked_intrinsics(self, intrinsics: torch.Tensor | None) -> torch.Tensor | None:
        if intrinsics is None:
            return None
        check_intrinsic_matrix("intrinsics", intrinsics)
        if intrinsics.shape != self._pose.shape[:2] + (3, 3):
            raise ValueError(
                f"intrinsics must be [B, C, 3, 3] = {list(self._pose.shape[:2]) + [3, 3]} like the "
                f"poses, got {tuple(intrinsics.shape)}"
            )
        if self.image_size is None:
            raise ValueError("intrinsics are pixel K of an image: pass image_size=(H, W) with them")
        return intrinsics

    def _checked_rays(
        self, rays: torch.Tensor | None, valid: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if rays is None:
            if valid is not None:
                raise ValueError("valid is the rays' mask: pass rays with it")
            return None, None
        check_float_coords("rays", rays)
        lead = rays.shape[:-2]
        if (
            rays.dim() not in (2, 3, 4)
            or rays.shape[-1] != 3
            or rays.shape[-2] != self.patches
            or not _broadcasts(lead, self._pose.shape[:2])
        ):
            raise ValueError(
                f"rays must be [P, 3], [C, P, 3] or [B, C, P, 3] with P = rows * cols = {self.patches} "
                f"and B, C = {tuple(self._pose.shape[:2])} (or 1), got {tuple(rays.shape)}"
            )
        if valid is not None:
            if valid.dtype != torch.bool or not _broadcasts(valid.shape, tuple(self._pose.shape[:2]) + (self.patches,)):
                raise ValueError(
                    f"valid must be a bool mask broadcastable to [B, C, P] = "
                    f"{list(self._pose.shape[:2]) + [self.patches]}, got {tuple(valid.shape)} {valid.dtype}"
                )
        return rays, valid

    def _checked_depth(self, depth: torch.Tensor | None) -> torch.Tensor | None:
        if depth is None:
            return None
        check_float_coords("depth", depth)
        if depth.dim() != 4 or depth.shape[0] not in (1, self.batch_size) or depth.shape[1] > self.num_cameras:
            raise ValueError(
                f"depth must be [B, C_known <= {self.num_cameras}, H, W] z-depth maps of the first "
                f"cameras, got {tuple(depth.shape)}"
            )
        if not bool(torch.isfinite(depth).all()):
            raise ValueError(
                "depth contains NaN or inf; expected finite z-depths (mask unknown views out by passing "
                "only the first C_known cameras' maps)"
            )
        return depth

    def _checked_orientation(self, orientation: torch.Tensor | None) -> torch.Tensor | None:
        if orientation is None:
            return None
        check_float_coords("orientation", orientation)
        if (
            orientation.dim() != 3
            or orientation.shape[1:] != (self.num_tokens, 3)
            or orientation.shape[0] not in (1, self.batch_size)
        ):
            raise ValueError(
                f"orientation must be [B or 1, C * P = {self.num_tokens}, 3] (latitude/up map), got "
                f"{tuple(orientation.shape)}"
            )
        return orientation


def _checked_pose(name: str, pose: object) -> torch.Tensor:
    if not isinstance(pose, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [B, C, 4, 4], got {type(pose).__name__}")
    if pose.dim() != 4:
        raise ValueError(f"{name} must be [B, C, 4, 4] (batch, cameras), got {tuple(pose.shape)}")
    return check_pose(name, pose)


def _checked_size(image_size: Sequence[float]) -> tuple[float, float]:
    try:
        height, width = image_size
    except (TypeError, ValueError):
        raise ValueError(f"image_size must be (H, W), got {image_size!r}") from None
    return (
        check_finite_number("image_size[0] (H)", height, True),
        check_finite_number("image_size[1] (W)", width, True),
    )


def _broadcasts(shape: Sequence[int], target: Sequence[int]) -> bool:
    """``shape`` broadcasts to ``target`` (numpy rules, without growing ``target``)."""
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(tuple(shape)[::-1], tuple(target)[::-1]))


def _per_camera(models: Models, count: int) -> list:
    if isinstance(models, CameraModel):
        return [models] * count
    models = list(models)
    if len(models) != count or not all(isinstance(m, CameraModel) for m in models):
        raise ValueError(
            f"models: expected one CameraModel or a list of {count} (one per camera), got {len(models)} item(s)"
        )
    return models
