"""Perspective cameras: the ideal pinhole and OpenCV's radial-tangential distortion."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TypeGuard

import torch

from .base import NEWTON_STEPS, safe_normalize
from .intrinsics import IntrinsicsCamera


@dataclass(frozen=True)
class Pinhole(IntrinsicsCamera):
    """Ideal perspective camera: ``u = fx X / Z + cx``. Points with ``Z <= 0`` project invalid."""

    def _unproject(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xy = self._to_normalized(pixels)
        rays, _ = safe_normalize(torch.cat([xy, torch.ones_like(xy[..., :1])], -1))
        return rays, torch.ones_like(rays[..., 0], dtype=torch.bool)

    def _project(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = points[..., 2]
        valid = z > 1e-12 * points.norm(dim=-1)
        z = torch.where(valid, z, torch.ones_like(z))
        return self._to_pixels(points[..., :2] / z[..., None]), valid


@dataclass(frozen=True)
class OpenCVCamera(IntrinsicsCamera):
    """OpenCV radial-tangential distortion ``(k1, k2, p1, p2, k3)`` of normalised coordinates.

    The radial map ``r -> r (1 + k1 r^2 + k2 r^4 + k3 r^6)`` must increase over the whole image, otherwise the
    image folds over itself and pixels have two rays: such coefficients raise ``ValueError``. Points beyond
    the fold radius project invalid. Unprojection inverts the distortion with Newton's method and marks
    pixels whose inverse does not converge invalid.
    """

    k1: float = 0.0
    k2: float = 0.0
    p1: float = 0.0
    p2: float = 0.0
    k3: float = 0.0

    def _radial(self, r2: torch.Tensor | float) -> torch.Tensor | float:
        """The radial factor ``1 + k1 r^2 + k2 r^4 + k3 r^6`` at ``r2 = r^2``."""
        return 1 + r2 * (self.k1 + r2 * (self.k2 + r2 * self.k3))

    @cached_property
    def _fold_radius(self) -> float:
        """The smallest normalised radius where the radial map stops increasing (``inf`` if it never does)."""
        radii = torch.linspace(1e-3, 20.0, 20000, dtype=torch.float64)  # normalised radius up to 20 (174 degrees)
        slope = 1 + 3 * self.k1 * radii**2 + 5 * self.k2 * radii**4 + 7 * self.k3 * radii**6  # d r_d / d r
        folds = radii[slope <= 0]
        return folds[0].item() if len(folds) else math.inf

    def _check_distortion(self) -> None:
        fold = self._fold_radius
        reach = fold * float(self._radial(fold**2)) if math.isfinite(fold) else math.inf
        if reach < self._max_image_radius():
            raise ValueError(
                f"distortion (k1={self.k1}, k2={self.k2}, k3={self.k3}) is outside the valid range for this "
                f"image: the radial map folds at normalised radius {fold:.3f} (distorted {reach:.3f}) inside the "
                f"image (corner radius {self._max_image_radius():.3f}); expected a map increasing over the image"
            )

    def _distort(self, xy: torch.Tensor) -> torch.Tensor:
        x, y = xy.unbind(-1)
        r2 = x * x + y * y
        radial = self._radial(r2)
        xd = x * radial + 2 * self.p1 * x * y + self.p2 * (r2 + 2 * x * x)
        yd = y * radial + self.p1 * (r2 + 2 * y * y) + 2 * self.p2 * x * y
        return torch.stack([xd, yd], -1)

    def _distort_jacobian(self, xy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, y = xy.unbind(-1)
        r2 = x * x + y * y
        radial = self._radial(r2)
        slope = self.k1 + r2 * (2 * self.k2 + 3 * self.k3 * r2)  # d radial / d r^2
        cross = 2 * x * y * slope + 2 * self.p1 * x + 2 * self.p2 * y
        dxx = radial + 2 * x * x * slope + 2 * self.p1 * y + 6 * self.p2 * x
        dyy = radial + 2 * y * y * slope + 6 * self.p1 * y + 2 * self.p2 * x
        return dxx, cross, dyy

    def _undistort(self, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xy = target.clone()
        for _ in range(NEWTON_STEPS):
            residual = self._distort(xy) - target
            dxx, cross, dyy = self._distort_jacobian(xy)
            det = dxx * dyy - cross * cross
            det = torch.where(det.abs() > 1e-12, det, torch.full_like(det, 1e-12))
            step = (
                torch.stack(
                    [
                        dyy * residual[..., 0] - cross * residual[..., 1],
                        dxx * residual[..., 1] - cross * residual[..., 0],
                    ],
                    -1,
                )
                / det[..., None]
            )
            xy = (xy - step).clamp(-1e6, 1e6)
        error = (self._distort(xy) - target).norm(dim=-1)
        tol = 1e-5 if target.dtype == torch.float32 else 1e-10
        valid = (error <= tol * (1 + target.norm(dim=-1))) & (xy.norm(dim=-1) < self._fold_radius)
        return xy, valid

    def _unproject(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xy, valid = self._undistort(self._to_normalized(pixels))
        xy = torch.where(valid[..., None], xy, torch.zeros_like(xy))
        rays, _ = safe_normalize(torch.cat([xy, torch.ones_like(xy[..., :1])], -1))
        return rays, valid

    def _project(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = points[..., 2]
        valid = z > 1e-12 * points.norm(dim=-1)
        xy = points[..., :2] / torch.where(valid, z, torch.ones_like(z))[..., None]
        valid = valid & (xy.norm(dim=-1) < self._fold_radius)
        xy = torch.where(valid[..., None], xy, torch.zeros_like(xy))
        return self._to_pixels(self._distort(xy)), valid


def is_linear_projection(model: object) -> TypeGuard[IntrinsicsCamera]:
    """``model`` projects through its ``K`` alone (an :class:`IntrinsicsCamera` that is not an OpenCV camera with
    a non-zero distortion coefficient): a PRoPE-style ``K`` describes it exactly."""
    if not isinstance(model, IntrinsicsCamera):
        return False
    return not (isinstance(model, OpenCVCamera) and any(getattr(model, k) != 0 for k in ("k1", "k2", "p1", "p2", "k3")))
