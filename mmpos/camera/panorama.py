"""The full 360 x 180 degree equirectangular panorama."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validation import check_finite_number
from .base import CameraModel


@dataclass(frozen=True)
class Equirectangular(CameraModel):
    """Full 360 x 180 degree panorama: column -> longitude (``-pi`` at ``u = 0``, 0 at the centre, about +y
    from +z towards +x), row -> latitude (``-pi/2`` at the top, y-down). Every direction is valid.
    Cropping changes the field of view a panorama must cover, so :meth:`cropped` raises."""

    width: float
    height: float

    def __post_init__(self) -> None:
        check_finite_number("width", self.width, True)
        check_finite_number("height", self.height, True)

    def resized(self, width: float, height: float) -> Equirectangular:
        return Equirectangular(check_finite_number("width", width, True), check_finite_number("height", height, True))

    def cropped(self, left: float, top: float, width: float, height: float) -> Equirectangular:
        raise ValueError(
            "an equirectangular panorama must cover 360 x 180 degrees; crop after reprojecting to a perspective camera"
        )

    def _unproject(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lon = (pixels[..., 0] / self.width - 0.5) * (2 * math.pi)
        lat = (pixels[..., 1] / self.height - 0.5) * math.pi
        rays = torch.stack([lat.cos() * lon.sin(), lat.sin(), lat.cos() * lon.cos()], -1)
        return rays, torch.ones_like(lon, dtype=torch.bool)

    def _project(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lon = torch.atan2(points[..., 0], points[..., 2])
        lat = torch.atan2(points[..., 1], points[..., [0, 2]].norm(dim=-1))
        pixels = torch.stack([(lon / (2 * math.pi) + 0.5) * self.width, (lat / math.pi + 0.5) * self.height], -1)
        return pixels, points.norm(dim=-1) > 0
