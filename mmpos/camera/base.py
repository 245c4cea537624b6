"""The camera-model interface and the helpers every model uses.

Conventions (one for the whole package):

- Camera axes are OpenCV's: x right, y down, z forward (the optical axis).
- Pixel coordinates are continuous: pixel ``(row i, col j)`` covers ``[j, j+1) x [i, i+1)`` and its centre is
  ``(u, v) = (j + 0.5, i + 0.5)``. The image spans ``[0, W] x [0, H]``, so ``cx = W / 2`` is the exact
  centre and intrinsics follow resizing by plain scaling (no half-pixel terms).
- Nothing returns NaN: every call returns ``(values, valid)``, where ``valid`` is a bool mask and invalid
  entries hold finite placeholders (the optical axis for rays, the principal point for pixels).
- Arithmetic runs in the input's dtype (float32 or float64; 16-bit is refused) with autocast off.
"""

from __future__ import annotations

import torch

from .._validation import check_float_coords

NEWTON_STEPS = 12  # Newton iterations of the distortion inverses (quadratic convergence: ample in fp64)


def check_last_dim(name: str, tensor: torch.Tensor, size: int) -> None:
    check_float_coords(name, tensor)
    if not tensor.is_floating_point() or tensor.dim() < 1 or tensor.shape[-1] != size:
        raise ValueError(
            f"{name} must be a float32/float64 tensor [..., {size}], got {tuple(tensor.shape)} {tensor.dtype}"
        )


def no_autocast(tensor: torch.Tensor) -> torch.autocast:
    return torch.autocast(tensor.device.type, enabled=False)


def safe_normalize(v: torch.Tensor, eps: float = 1e-30) -> tuple[torch.Tensor, torch.Tensor]:
    """``(v / |v|, |v|)``: ``v [..., n]`` -> ``([..., n], [...])``; the norm is floored at ``eps``."""
    norm = v.norm(dim=-1, keepdim=True)
    return v / norm.clamp_min(eps), norm[..., 0]


class CameraModel:
    """Interface shared by every model (see the module docstring for the conventions)."""

    width: float
    height: float

    def unproject(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``pixels [..., 2]`` (u, v) -> ``(rays [..., 3] unit norm, valid [...] bool)``; non-finite pixels are
        invalid (the optical axis)."""
        check_last_dim("pixels", pixels, 2)
        with no_autocast(pixels):
            rays, valid = self._unproject(pixels)
            return finite_or_invalid(pixels, rays, valid, optical_axis(rays))

    def project(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``points [..., 3]`` in the camera frame -> ``(pixels [..., 2], valid [...] bool)``; non-finite points
        are invalid (the image centre)."""
        check_last_dim("points", points, 3)
        with no_autocast(points):
            pixels, valid = self._project(points)
            centre = torch.tensor([self.width / 2, self.height / 2], dtype=pixels.dtype, device=pixels.device)
            return finite_or_invalid(points, pixels, valid, centre.expand_as(pixels))

    def resized(self, width: float, height: float) -> CameraModel:
        """The same camera imaging to a ``width x height`` image (intrinsics scale with the image)."""
        raise NotImplementedError

    def cropped(self, left: float, top: float, width: float, height: float) -> CameraModel:
        """The camera of the sub-image ``[left, left + width) x [top, top + height)``."""
        raise NotImplementedError

    def _unproject(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's own ``pixels [..., 2] -> (rays [..., 3], valid [...])`` (inputs already checked)."""
        raise NotImplementedError

    def _project(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's own ``points [..., 3] -> (pixels [..., 2], valid [...])`` (inputs already checked)."""
        raise NotImplementedError


def finite_or_invalid(
    inputs: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, placeholder: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, valid)`` with entries whose input or value is NaN or inf marked invalid and set to
    ``placeholder`` (the package promises no NaN); finite entries are returned unchanged."""
    bad = ~(torch.isfinite(inputs).all(-1) & torch.isfinite(values).all(-1))
    if not bad.any():
        return values, valid
    return torch.where(bad[..., None], placeholder, values), valid & ~bad


def optical_axis(like: torch.Tensor) -> torch.Tensor:
    axis = torch.zeros_like(like)
    axis[..., 2] = 1
    return axis
