"""Wide-angle cameras: Kannala-Brandt fisheye and the unified camera model (pinhole through beyond 180 degrees)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch

from .._validation import check_finite_number
from .base import NEWTON_STEPS, optical_axis, safe_normalize
from .intrinsics import IntrinsicsCamera


@dataclass(frozen=True)
class KannalaBrandt(IntrinsicsCamera):
    """Kannala-Brandt fisheye (OpenCV ``fisheye``): ``r = theta (1 + k1 theta^2 + ... + k4 theta^8)``, where
    theta is the angle to the optical axis and r the normalised image radius.

    ``max_angle`` (radians, below pi) is the lens' half field of view; the polynomial must increase on
    ``[0, max_angle]`` (else ``ValueError``). Rays beyond it and pixels outside the image circle
    ``r(max_angle)`` are invalid.
    """

    k1: float = 0.0
    k2: float = 0.0
    k3: float = 0.0
    k4: float = 0.0
    max_angle: float = math.pi / 2

    def _theta_d(self, theta: torch.Tensor | float) -> torch.Tensor | float:
        """The normalised image radius ``r(theta)``."""
        t2 = theta * theta
        return theta * (1 + t2 * (self.k1 + t2 * (self.k2 + t2 * (self.k3 + t2 * self.k4))))

    def _theta_d_slope(self, theta: torch.Tensor) -> torch.Tensor:
        """``d r / d theta``."""
        t2 = theta * theta
        return 1 + t2 * (3 * self.k1 + t2 * (5 * self.k2 + t2 * (7 * self.k3 + t2 * 9 * self.k4)))

    def _check_distortion(self) -> None:
        check_finite_number("max_angle", self.max_angle, positive=True)
        if self.max_angle >= math.pi:
            raise ValueError(
                f"max_angle must be below pi (a ray straight backwards has no image), got {self.max_angle}"
            )
        samples = torch.linspace(0, self.max_angle, 2001, dtype=torch.float64)
        if bool((self._theta_d_slope(samples) <= 0).any()):
            raise ValueError(
                f"fisheye coefficients (k1={self.k1}, k2={self.k2}, k3={self.k3}, k4={self.k4}) are "
                f"outside the valid range: r(theta) must increase on [0, max_angle={self.max_angle:.4f}]"
            )
        _ = self._max_radius

    @cached_property
    def _max_radius(self) -> float:
        """The image circle's normalised radius ``r(max_angle)``."""
        return float(self._theta_d(self.max_angle))

    def _unproject(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xy = self._to_normalized(pixels)
        radius = xy.norm(dim=-1)
        valid = radius <= self._max_radius
        target = radius.clamp(max=self._max_radius)
        theta = target.clamp(max=self.max_angle)
        for _ in range(NEWTON_STEPS):
            theta = (theta - (self._theta_d(theta) - target) / self._theta_d_slope(theta)).clamp(0, self.max_angle)
        small = radius < 1e-12  # sin(theta) / r -> 1 on the optical axis
        scale = torch.where(small, torch.ones_like(radius), theta.sin() / radius.clamp_min(1e-12))
        rays = torch.cat([xy * scale[..., None], theta.cos()[..., None]], -1)
        rays = torch.where(valid[..., None], rays, optical_axis(rays))
        return rays, valid

    def _project(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rho = points[..., :2].norm(dim=-1)
        theta = torch.atan2(rho, points[..., 2])
        valid = (theta <= self.max_angle) & (points.norm(dim=-1) > 0)
        theta = torch.where(valid, theta, torch.zeros_like(theta))
        small = rho < 1e-12 * points.norm(dim=-1).clamp_min(1e-300)  # on the optical axis: the principal point
        scale = torch.where(small, torch.zeros_like(rho), self._theta_d(theta) / rho.clamp_min(1e-300))
        return self._to_pixels(points[..., :2] * scale[..., None]), valid


@dataclass(frozen=True)
class UnifiedCamera(IntrinsicsCamera):
    """Unified camera model (Mei; Geyer-Daniilidis): ``u = fx X / (Z + xi |X|) + cx``.

    ``xi = 0`` is the pinhole; ``xi`` near 1 a fisheye of about 180 degrees; ``xi > 1`` sees beyond 180 degrees,
    and then pixels outside the image circle ``r^2 <= 1 / (xi^2 - 1)`` (normalised) have no ray and are invalid.
    ``xi`` must be finite and ``>= 0``. Points project validly when ``Z > -w |X|`` with ``w = xi`` for
    ``xi <= 1`` and ``1 / xi`` above (the part of the sphere the model maps one-to-one).
    """

    xi: float = 0.0

    def _check_distortion(self) -> None:
        check_finite_number("xi", self.xi)
        if self.xi < 0:
            raise ValueError(f"xi must be >= 0 (0 is the pinhole camera), got {self.xi}")

    @classmethod
    def from_fov(cls, width: float, height: float, fov_degrees: float, xi: float = 0.0) -> "UnifiedCamera":
        """Square pixels, centred principal point, horizontal field of view ``fov_degrees`` (UCPE's
        ``fx = (W / 2) (cos a + xi) / sin a`` with ``a = fov / 2``)."""
        check_finite_number("fov_degrees", fov_degrees, True)
        half = math.radians(fov_degrees) / 2
        if not 0 < half < math.pi or math.cos(half) + xi <= 0:
            raise ValueError(
                f"fov_degrees={fov_degrees} is not reachable with xi={xi}: expected cos(fov / 2) + xi > 0 and fov < 360"
            )
        focal = (width / 2) * (math.cos(half) + xi) / math.sin(half)
        return cls(focal, focal, width / 2, height / 2, width, height, xi)

    def _unproject(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xy = self._to_normalized(pixels)
        r2 = (xy * xy).sum(-1)
        inside = 1 + (1 - self.xi**2) * r2
        valid = inside >= 0
        gamma = (self.xi + inside.clamp_min(0).sqrt()) / (1 + r2)
        rays = torch.cat([xy * gamma[..., None], (gamma - self.xi)[..., None]], -1)
        rays, _ = safe_normalize(rays)  # unit already up to round-off; exact unit norm for the encodings
        rays = torch.where(valid[..., None], rays, optical_axis(rays))
        return rays, valid

    def _project(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        norm = points.norm(dim=-1)
        w = self.xi if self.xi <= 1 else 1 / self.xi
        valid = (points[..., 2] > -w * norm) & (norm > 0)
        denom = points[..., 2] + self.xi * norm
        valid = valid & (denom > 1e-12 * norm)
        denom = torch.where(valid, denom, torch.ones_like(denom))
        xy = torch.where(valid[..., None], points[..., :2] / denom[..., None], torch.zeros_like(points[..., :2]))
        return self._to_pixels(xy), valid
