"""Cameras described by focal lengths and a principal point in pixels, and intrinsic matrices ``K``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from .._validation import check_finite_number, check_float_coords
from .base import CameraModel


@dataclass(frozen=True)
class IntrinsicsCamera(CameraModel):
    """Focal lengths and principal point in pixels, image size in pixels."""

    fx: float
    fy: float
    cx: float
    cy: float
    width: float
    height: float

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            check_finite_number(f.name, value, positive=f.name in ("fx", "fy", "width", "height"))
            object.__setattr__(self, f.name, float(value))
        self._check_distortion()

    def _check_distortion(self) -> None:
        pass

    def intrinsic_matrix(
        self, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """``K [3, 3]`` in pixels."""
        return torch.tensor(
            [[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]], dtype=dtype, device=device
        )

    def resized(self, width: float, height: float) -> IntrinsicsCamera:
        sx = check_finite_number("width", width, True) / self.width
        sy = check_finite_number("height", height, True) / self.height
        return replace(
            self,
            fx=self.fx * sx,
            fy=self.fy * sy,
            cx=self.cx * sx,
            cy=self.cy * sy,
            width=float(width),
            height=float(height),
        )

    def cropped(self, left: float, top: float, width: float, height: float) -> IntrinsicsCamera:
        check_crop(self, left, top, width, height)
        return replace(self, cx=self.cx - left, cy=self.cy - top, width=float(width), height=float(height))

    def _to_normalized(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.stack([(pixels[..., 0] - self.cx) / self.fx, (pixels[..., 1] - self.cy) / self.fy], -1)

    def _to_pixels(self, xy: torch.Tensor) -> torch.Tensor:
        return torch.stack([xy[..., 0] * self.fx + self.cx, xy[..., 1] * self.fy + self.cy], -1)

    def _max_image_radius(self) -> float:
        """Largest normalised radius of the image's corners."""
        corners = [
            ((u - self.cx) / self.fx, (v - self.cy) / self.fy) for u in (0, self.width) for v in (0, self.height)
        ]
        return max(math.hypot(x, y) for x, y in corners)


def check_crop(camera: CameraModel, left: float, top: float, width: float, height: float) -> None:
    """The crop ``[left, left + width) x [top, top + height)`` is finite and inside ``camera``'s image."""
    for name, value in (("left", left), ("top", top)):
        check_finite_number(name, value)
    check_finite_number("width", width, True)
    check_finite_number("height", height, True)
    if left < 0 or top < 0 or left + width > camera.width or top + height > camera.height:
        raise ValueError(
            f"crop [{left}, {left + width}) x [{top}, {top + height}) lies outside the "
            f"{camera.width:g} x {camera.height:g} image"
        )


def check_intrinsic_matrix(name: str, matrix: torch.Tensor) -> None:
    """``K [..., 3, 3]`` in pixels: finite, positive focal lengths, last row ``(0, 0, 1)``."""
    check_float_coords(name, matrix)
    if matrix.dim() < 2 or matrix.shape[-2:] != (3, 3):
        raise ValueError(f"{name} must be [..., 3, 3] intrinsic matrices, got {tuple(matrix.shape)}")
    if not bool(torch.isfinite(matrix).all()):
        raise ValueError(f"{name} contains non-finite values; expected finite focal lengths and principal points")
    if not bool(((matrix[..., 0, 0] > 0) & (matrix[..., 1, 1] > 0)).all()):
        raise ValueError(f"{name}: focal lengths K[0, 0] and K[1, 1] must be positive")
    bottom = matrix[..., 2, :] - torch.tensor([0.0, 0.0, 1.0], dtype=matrix.dtype, device=matrix.device)
    if not bool((bottom == 0).all()) or not bool((matrix[..., 1, 0] == 0).all()):
        raise ValueError(f"{name} must be upper triangular with last row (0, 0, 1)")


def normalized_intrinsics(matrix: torch.Tensor, image_size: Sequence[float]) -> torch.Tensor:
    """Intrinsics mapping to image coordinates in ``[-1/2, 1/2]``: ``[[fx/W, s/W, cx/W - 1/2], [0, fy/H,
    cy/H - 1/2], [0, 0, 1]]`` for ``image_size = (H, W)`` (PRoPE's and RayRoPE's normalisation)."""
    height, width = (float(s) for s in image_size)
    if not (height > 0 and width > 0 and math.isfinite(height) and math.isfinite(width)):
        raise ValueError(f"image_size must be positive (height, width), got {tuple(image_size)}")
    scale = torch.tensor(
        [[1 / width, 0, -0.5], [0, 1 / height, -0.5], [0, 0, 1]], dtype=matrix.dtype, device=matrix.device
    )
    return scale @ matrix
