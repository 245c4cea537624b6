"""Camera models: ``project`` (camera-frame points -> pixels) and ``unproject`` (pixels -> unit rays).

Conventions (one for the whole package):

- Camera axes are OpenCV's: x right, y down, z forward (the optical axis).
- Pixel coordinates are continuous: pixel ``(row i, col j)`` covers ``[j, j+1) x [i, i+1)`` and its centre is
  ``(u, v) = (j + 0.5, i + 0.5)``. The image spans ``[0, W] x [0, H]``, so ``cx = W / 2`` is the exact
  centre and intrinsics follow resizing by plain scaling (no half-pixel terms).
- Nothing returns NaN: every call returns ``(values, valid)``, where ``valid`` is a bool mask and invalid
  entries hold finite placeholders (the optical axis for rays, the principal point for pixels).
- Arithmetic runs in the input's dtype (float32 or float64; 16-bit is refused) with autocast off.

Models: :class:`Pinhole`, :class:`OpenCVCamera` (radial-tangential), :class:`KannalaBrandt` (fisheye),
:class:`UnifiedCamera` (xi: pinhole at 0 through beyond-180-degree fisheye above 1),
:class:`Equirectangular` (full 360 x 180 panorama).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch

from .._validation import check_float_coords

NEWTON_STEPS = 12  # Newton iterations of the distortion inverses (quadratic convergence: ample in fp64)


def _check_finite_number(name: str, value, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return float(value)


def _check_last_dim(name: str, tensor: torch.Tensor, size: int) -> None:
    check_float_coords(name, tensor)
    if not tensor.is_floating_point() or tensor.dim() < 1 or tensor.shape[-1] != size:
        raise ValueError(f"{name} must be a float32/float64 tensor [..., {size}], got {tuple(tensor.shape)} "
                         f"{tensor.dtype}")


def _no_autocast(tensor: torch.Tensor):
    return torch.autocast(tensor.device.type, enabled=False)


def _safe_normalize(v: torch.Tensor, eps: float = 1e-30):
    norm = v.norm(dim=-1, keepdim=True)
    return v / norm.clamp_min(eps), norm[..., 0]


class CameraModel:
    """Interface shared by every model (see the module docstring for the conventions)."""

    width: float
    height: float

    def unproject(self, pixels: torch.Tensor):
        """``pixels [..., 2]`` (u, v) -> ``(rays [..., 3] unit norm, valid [...] bool)``."""
        _check_last_dim("pixels", pixels, 2)
        with _no_autocast(pixels):
            return self._unproject(pixels)

    def project(self, points: torch.Tensor):
        """``points [..., 3]`` in the camera frame -> ``(pixels [..., 2], valid [...] bool)``."""
        _check_last_dim("points", points, 3)
        with _no_autocast(points):
            return self._project(points)

    def resized(self, width: float, height: float):
        """The same camera imaging to a ``width x height`` image (intrinsics scale with the image)."""
        raise NotImplementedError

    def cropped(self, left: float, top: float, width: float, height: float):
        """The camera of the sub-image ``[left, left + width) x [top, top + height)``."""
        raise NotImplementedError


@dataclass(frozen=True)
class _Intrinsics(CameraModel):
    """Focal lengths and principal point in pixels, image size in pixels."""

    fx: float
    fy: float
    cx: float
    cy: float
    width: float
    height: float

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            _check_finite_number(f.name, value, positive=f.name in ("fx", "fy", "width", "height"))
            object.__setattr__(self, f.name, float(value))
        self._check_distortion()

    def _check_distortion(self):
        pass

    def intrinsic_matrix(self, dtype=torch.float32, device=None) -> torch.Tensor:
        """``K [3, 3]`` in pixels."""
        return torch.tensor([[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]], dtype=dtype,
                            device=device)

    def resized(self, width, height):
        sx = _check_finite_number("width", width, True) / self.width
        sy = _check_finite_number("height", height, True) / self.height
        return replace(self, fx=self.fx * sx, fy=self.fy * sy, cx=self.cx * sx, cy=self.cy * sy,
                       width=float(width), height=float(height))

    def cropped(self, left, top, width, height):
        _check_crop(self, left, top, width, height)
        return replace(self, cx=self.cx - left, cy=self.cy - top, width=float(width), height=float(height))

    def _to_normalized(self, pixels):
        return torch.stack([(pixels[..., 0] - self.cx) / self.fx, (pixels[..., 1] - self.cy) / self.fy], -1)

    def _to_pixels(self, xy):
        return torch.stack([xy[..., 0] * self.fx + self.cx, xy[..., 1] * self.fy + self.cy], -1)

    def _max_image_radius(self) -> float:
        """Largest normalised radius of the image's corners."""
        corners = [((u - self.cx) / self.fx, (v - self.cy) / self.fy) for u in (0, self.width)
                   for v in (0, self.height)]
        return max(math.hypot(x, y) for x, y in corners)


def _check_crop(camera, left, top, width, height):
    for name, value in (("left", left), ("top", top)):
        _check_finite_number(name, value)
    _check_finite_number("width", width, True)
    _check_finite_number("height", height, True)
    if left < 0 or top < 0 or left + width > camera.width or top + height > camera.height:
        raise ValueError(f"crop [{left}, {left + width}) x [{top}, {top + height}) lies outside the "
                         f"{camera.width:g} x {camera.height:g} image")


@dataclass(frozen=True)
class Pinhole(_Intrinsics):
    """Ideal perspective camera: ``u = fx X / Z + cx``. Points with ``Z <= 0`` project invalid."""

    def _unproject(self, pixels):
        xy = self._to_normalized(pixels)
        rays, _ = _safe_normalize(torch.cat([xy, torch.ones_like(xy[..., :1])], -1))
        return rays, torch.ones_like(rays[..., 0], dtype=torch.bool)

    def _project(self, points):
        z = points[..., 2]
        valid = z > 1e-12 * points.norm(dim=-1)
        z = torch.where(valid, z, torch.ones_like(z))
        return self._to_pixels(points[..., :2] / z[..., None]), valid


@dataclass(frozen=True)
class OpenCVCamera(_Intrinsics):
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

    def _radial(self, r2):
        return 1 + r2 * (self.k1 + r2 * (self.k2 + r2 * self.k3))

    def _check_distortion(self):
        radii = torch.linspace(1e-3, 20.0, 20000, dtype=torch.float64)  # normalised radius up to 20 (174 degrees)
        slope = 1 + 3 * self.k1 * radii**2 + 5 * self.k2 * radii**4 + 7 * self.k3 * radii**6  # d r_d / d r
        folds = radii[slope <= 0]
        fold = folds[0].item() if len(folds) else math.inf
        object.__setattr__(self, "_fold_radius", fold)
        reach = fold * self._radial(fold**2) if math.isfinite(fold) else math.inf
        if reach < self._max_image_radius():
            raise ValueError(
                f"distortion (k1={self.k1}, k2={self.k2}, k3={self.k3}) is outside the valid range for this "
                f"image: the radial map folds at normalised radius {fold:.3f} (distorted {reach:.3f}) inside the "
                f"image (corner radius {self._max_image_radius():.3f}); expected a map increasing over the image")

    def _distort(self, xy):
        x, y = xy.unbind(-1)
        r2 = x * x + y * y
        radial = self._radial(r2)
        xd = x * radial + 2 * self.p1 * x * y + self.p2 * (r2 + 2 * x * x)
        yd = y * radial + self.p1 * (r2 + 2 * y * y) + 2 * self.p2 * x * y
        return torch.stack([xd, yd], -1)

    def _distort_jacobian(self, xy):
        x, y = xy.unbind(-1)
        r2 = x * x + y * y
        radial = self._radial(r2)
        slope = self.k1 + r2 * (2 * self.k2 + 3 * self.k3 * r2)  # d radial / d r^2
        cross = 2 * x * y * slope + 2 * self.p1 * x + 2 * self.p2 * y
        dxx = radial + 2 * x * x * slope + 2 * self.p1 * y + 6 * self.p2 * x
        dyy = radial + 2 * y * y * slope + 6 * self.p1 * y + 2 * self.p2 * x
        return dxx, cross, dyy

    def _undistort(self, target):
        xy = target.clone()
        for _ in range(NEWTON_STEPS):
            residual = self._distort(xy) - target
            dxx, cross, dyy = self._distort_jacobian(xy)
            det = dxx * dyy - cross * cross
            det = torch.where(det.abs() > 1e-12, det, torch.full_like(det, 1e-12))
            step = torch.stack([dyy * residual[..., 0] - cross * residual[..., 1],
                                dxx * residual[..., 1] - cross * residual[..., 0]], -1) / det[..., None]
            xy = (xy - step).clamp(-1e6, 1e6)
        error = (self._distort(xy) - target).norm(dim=-1)
        tol = 1e-5 if target.dtype == torch.float32 else 1e-10
        valid = (error <= tol * (1 + target.norm(dim=-1))) & (xy.norm(dim=-1) < self._fold_radius)
        return xy, valid

    def _unproject(self, pixels):
        xy, valid = self._undistort(self._to_normalized(pixels))
        xy = torch.where(valid[..., None], xy, torch.zeros_like(xy))
        rays, _ = _safe_normalize(torch.cat([xy, torch.ones_like(xy[..., :1])], -1))
        return rays, valid

    def _project(self, points):
        z = points[..., 2]
        valid = z > 1e-12 * points.norm(dim=-1)
        xy = points[..., :2] / torch.where(valid, z, torch.ones_like(z))[..., None]
        valid = valid & (xy.norm(dim=-1) < self._fold_radius)
        xy = torch.where(valid[..., None], xy, torch.zeros_like(xy))
        return self._to_pixels(self._distort(xy)), valid


@dataclass(frozen=True)
class KannalaBrandt(_Intrinsics):
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

    def _theta_d(self, theta):
        t2 = theta * theta
        return theta * (1 + t2 * (self.k1 + t2 * (self.k2 + t2 * (self.k3 + t2 * self.k4))))

    def _theta_d_slope(self, theta):
        t2 = theta * theta
        return 1 + t2 * (3 * self.k1 + t2 * (5 * self.k2 + t2 * (7 * self.k3 + t2 * 9 * self.k4)))

    def _check_distortion(self):
        _check_finite_number("max_angle", self.max_angle, positive=True)
        if self.max_angle >= math.pi:
            raise ValueError(f"max_angle must be below pi (a ray straight backwards has no image), "
                             f"got {self.max_angle}")
        samples = torch.linspace(0, self.max_angle, 2001, dtype=torch.float64)
        if bool((self._theta_d_slope(samples) <= 0).any()):
            raise ValueError(f"fisheye coefficients (k1={self.k1}, k2={self.k2}, k3={self.k3}, k4={self.k4}) are "
                             f"outside the valid range: r(theta) must increase on [0, max_angle={self.max_angle:.4f}]")
        object.__setattr__(self, "_max_radius", self._theta_d(self.max_angle))

    def _unproject(self, pixels):
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
        rays = torch.where(valid[..., None], rays, _optical_axis(rays))
        return rays, valid

    def _project(self, points):
        rho = points[..., :2].norm(dim=-1)
        theta = torch.atan2(rho, points[..., 2])
        valid = (theta <= self.max_angle) & (points.norm(dim=-1) > 0)
        theta = torch.where(valid, theta, torch.zeros_like(theta))
        small = rho < 1e-12 * points.norm(dim=-1).clamp_min(1e-300)  # on the optical axis: the principal point
        scale = torch.where(small, torch.zeros_like(rho), self._theta_d(theta) / rho.clamp_min(1e-300))
        return self._to_pixels(points[..., :2] * scale[..., None]), valid


@dataclass(frozen=True)
class UnifiedCamera(_Intrinsics):
    """Unified camera model (Mei; Geyer-Daniilidis): ``u = fx X / (Z + xi |X|) + cx``.

    ``xi = 0`` is the pinhole; ``xi`` near 1 a fisheye of about 180 degrees; ``xi > 1`` sees beyond 180 degrees,
    and then pixels outside the image circle ``r^2 <= 1 / (xi^2 - 1)`` (normalised) have no ray and are invalid.
    ``xi`` must be finite and ``>= 0``. Points project validly when ``Z > -w |X|`` with ``w = xi`` for
    ``xi <= 1`` and ``1 / xi`` above (the part of the sphere the model maps one-to-one).
    """

    xi: float = 0.0

    def _check_distortion(self):
        _check_finite_number("xi", self.xi)
        if self.xi < 0:
            raise ValueError(f"xi must be >= 0 (0 is the pinhole camera), got {self.xi}")

    @classmethod
    def from_fov(cls, width: float, height: float, fov_degrees: float, xi: float = 0.0) -> "UnifiedCamera":
        """Square pixels, centred principal point, horizontal field of view ``fov_degrees`` (UCPE's
        ``fx = (W / 2) (cos a + xi) / sin a`` with ``a = fov / 2``)."""
        _check_finite_number("fov_degrees", fov_degrees, True)
        half = math.radians(fov_degrees) / 2
        if not 0 < half < math.pi or math.cos(half) + xi <= 0:
            raise ValueError(f"fov_degrees={fov_degrees} is not reachable with xi={xi}: expected "
                             f"cos(fov / 2) + xi > 0 and fov < 360")
        focal = (width / 2) * (math.cos(half) + xi) / math.sin(half)
        return cls(focal, focal, width / 2, height / 2, width, height, xi)

    def _unproject(self, pixels):
        xy = self._to_normalized(pixels)
        r2 = (xy * xy).sum(-1)
        inside = 1 + (1 - self.xi**2) * r2
        valid = inside >= 0
        gamma = (self.xi + inside.clamp_min(0).sqrt()) / (1 + r2)
        rays = torch.cat([xy * gamma[..., None], (gamma - self.xi)[..., None]], -1)
        rays, _ = _safe_normalize(rays)  # unit already up to round-off; exact unit norm for the encodings
        rays = torch.where(valid[..., None], rays, _optical_axis(rays))
        return rays, valid

    def _project(self, points):
        norm = points.norm(dim=-1)
        w = self.xi if self.xi <= 1 else 1 / self.xi
        valid = (points[..., 2] > -w * norm) & (norm > 0)
        denom = points[..., 2] + self.xi * norm
        valid = valid & (denom > 1e-12 * norm)
        denom = torch.where(valid, denom, torch.ones_like(denom))
        xy = torch.where(valid[..., None], points[..., :2] / denom[..., None], torch.zeros_like(points[..., :2]))
        return self._to_pixels(xy), valid


@dataclass(frozen=True)
class Equirectangular(CameraModel):
    """Full 360 x 180 degree panorama: column -> longitude (``-pi`` at ``u = 0``, 0 at the centre, about +y
    from +z towards +x), row -> latitude (``-pi/2`` at the top, y-down). Every direction is valid.
    Cropping changes the field of view a panorama must cover, so :meth:`cropped` raises."""

    width: float
    height: float

    def __post_init__(self):
        _check_finite_number("width", self.width, True)
        _check_finite_number("height", self.height, True)

    def resized(self, width, height):
        return Equirectangular(_check_finite_number("width", width, True),
                               _check_finite_number("height", height, True))

    def cropped(self, left, top, width, height):
        raise ValueError("an equirectangular panorama must cover 360 x 180 degrees; crop after reprojecting "
                         "to a perspective camera")

    def _unproject(self, pixels):
        lon = (pixels[..., 0] / self.width - 0.5) * (2 * math.pi)
        lat = (pixels[..., 1] / self.height - 0.5) * math.pi
        rays = torch.stack([lat.cos() * lon.sin(), lat.sin(), lat.cos() * lon.cos()], -1)
        return rays, torch.ones_like(lon, dtype=torch.bool)

    def _project(self, points):
        lon = torch.atan2(points[..., 0], points[..., 2])
        lat = torch.atan2(points[..., 1], points[..., [0, 2]].norm(dim=-1))
        pixels = torch.stack([(lon / (2 * math.pi) + 0.5) * self.width, (lat / math.pi + 0.5) * self.height], -1)
        return pixels, points.norm(dim=-1) > 0


def _optical_axis(like: torch.Tensor) -> torch.Tensor:
    axis = torch.zeros_like(like)
    axis[..., 2] = 1
    return axis


CAMERA_MODELS = {"pinhole": Pinhole, "opencv": OpenCVCamera, "kannala_brandt": KannalaBrandt,
                 "unified": UnifiedCamera, "equirectangular": Equirectangular}


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


def normalized_intrinsics(matrix: torch.Tensor, image_size) -> torch.Tensor:
    """Intrinsics mapping to image coordinates in ``[-1/2, 1/2]``: ``[[fx/W, s/W, cx/W - 1/2], [0, fy/H,
    cy/H - 1/2], [0, 0, 1]]`` for ``image_size = (H, W)`` (PRoPE's and RayRoPE's normalisation)."""
    height, width = (float(s) for s in image_size)
    if not (height > 0 and width > 0 and math.isfinite(height) and math.isfinite(width)):
        raise ValueError(f"image_size must be positive (height, width), got {tuple(image_size)}")
    scale = torch.tensor([[1 / width, 0, -0.5], [0, 1 / height, -0.5], [0, 0, 1]], dtype=matrix.dtype,
                         device=matrix.device)
    return scale @ matrix
