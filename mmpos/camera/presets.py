"""Preset camera trajectories of N frames, eased in and out (zero velocity at both ends).

Every preset starts at (or, for ``arc``, is centred on) the identity camera: at the origin, looking down
+z with y down (OpenCV axes). Positive angles turn right (pan), up (tilt), and the camera's x axis
towards its y axis (roll).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .._validation import check_choice, check_positive_int
from .poses import axis_angle_to_matrix, look_at, pose_from_rotation_translation
from .trajectory import Trajectory

AXES = {"pan": (0.0, 1.0, 0.0), "tilt": (1.0, 0.0, 0.0), "roll": (0.0, 0.0, 1.0)}


def ease(num_frames: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``[N]`` progress from 0 to 1 with zero slope at both ends: ``(1 - cos(pi s)) / 2``."""
    check_positive_int("num_frames", num_frames)
    s = torch.linspace(0, 1, num_frames, dtype=dtype) if num_frames > 1 else torch.zeros(1, dtype=dtype)
    return (1 - torch.cos(math.pi * s)) / 2


def base_intrinsics(
    num_frames: int,
    fov_degrees: float = 60.0,
    aspect: float = 16 / 9,
    zoom: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """``[N, 4]`` normalised pinhole intrinsics with horizontal FoV ``fov_degrees`` and square pixels."""
    fx = 0.5 / math.tan(math.radians(fov_degrees) / 2)
    scale = torch.ones(num_frames, dtype=dtype) if zoom is None else zoom
    return torch.stack([fx * scale, fx * aspect * scale, torch.full_like(scale, 0.5), torch.full_like(scale, 0.5)], -1)


def _rotation_preset(
    axis: tuple[float, float, float], num_frames: int, degrees: float, dtype: torch.dtype
) -> Trajectory:
    angle = ease(num_frames, dtype) * math.radians(degrees)
    rotation = axis_angle_to_matrix(angle[:, None] * torch.tensor(axis, dtype=dtype))
    c2w = pose_from_rotation_translation(rotation, torch.zeros(num_frames, 3, dtype=dtype))
    return Trajectory(c2w, base_intrinsics(num_frames, dtype=dtype))


def pan(num_frames: int, degrees: float = 45.0, dtype: torch.dtype = torch.float64) -> Trajectory:
    """Turn about the camera's vertical axis (yaw), position fixed."""
    return _rotation_preset(AXES["pan"], num_frames, degrees, dtype)


def tilt(num_frames: int, degrees: float = 30.0, dtype: torch.dtype = torch.float64) -> Trajectory:
    """Turn about the camera's horizontal axis (pitch); positive looks up."""
    return _rotation_preset(AXES["tilt"], num_frames, degrees, dtype)


def roll(num_frames: int, degrees: float = 30.0, dtype: torch.dtype = torch.float64) -> Trajectory:
    """Turn about the optical axis."""
    return _rotation_preset(AXES["roll"], num_frames, degrees, dtype)


def dolly(num_frames: int, distance: float = 1.0, dtype: torch.dtype = torch.float64) -> Trajectory:
    """Move along the optical axis by ``distance`` (positive: in, towards the scene)."""
    position = torch.zeros(num_frames, 3, dtype=dtype)
    position[:, 2] = ease(num_frames, dtype) * distance
    c2w = pose_from_rotation_translation(torch.eye(3, dtype=dtype).expand(num_frames, 3, 3), position)
    return Trajectory(c2w, base_intrinsics(num_frames, dtype=dtype))


def zoom(num_frames: int, factor: float = 2.0, dtype: torch.dtype = torch.float64) -> Trajectory:
    """Scale the focal length from 1x to ``factor`` (below 1 zooms out); pose fixed."""
    if not factor > 0:
        raise ValueError(f"factor must be positive, got {factor}")
    scale = factor ** ease(num_frames, dtype)  # geometric: constant relative speed in the middle
    c2w = torch.eye(4, dtype=dtype).expand(num_frames, 4, 4).clone()
    return Trajectory(c2w, base_intrinsics(num_frames, zoom=scale, dtype=dtype))


def orbit(
    num_frames: int,
    degrees: float = 360.0,
    radius: float = 2.0,
    start_degrees: float = 0.0,
    dtype: torch.dtype = torch.float64,
) -> Trajectory:
    """Circle the point ``(0, 0, radius)`` at distance ``radius`` in the horizontal plane, looking at it
    (positive ``degrees``: the camera moves left and turns right)."""
    if not radius > 0:
        raise ValueError(f"radius must be positive, got {radius}")
    angle = math.radians(start_degrees) + ease(num_frames, dtype) * math.radians(degrees)
    target = torch.tensor([0.0, 0.0, radius], dtype=dtype)
    eye = target + radius * torch.stack([-angle.sin(), torch.zeros_like(angle), -angle.cos()], -1)
    return Trajectory(look_at(eye, target.expand_as(eye)), base_intrinsics(num_frames, dtype=dtype))


def arc(num_frames: int, degrees: float = 60.0, radius: float = 2.0, dtype: torch.dtype = torch.float64) -> Trajectory:
    """An orbit segment of ``degrees`` centred on the identity camera."""
    return orbit(num_frames, degrees, radius, start_degrees=-degrees / 2, dtype=dtype)


PRESETS: dict[str, Callable[..., Trajectory]] = {
    "orbit": orbit,
    "arc": arc,
    "dolly": dolly,
    "pan": pan,
    "tilt": tilt,
    "roll": roll,
    "zoom": zoom,
    # the earlier names (mmpos.camera.vocabulary parses them as aliases of dolly / zoom)
    "dolly_in": lambda n, distance=1.0, dtype=torch.float64: dolly(n, abs(distance), dtype),
    "dolly_out": lambda n, distance=1.0, dtype=torch.float64: dolly(n, -abs(distance), dtype),
    "zoom_in": lambda n, factor=2.0, dtype=torch.float64: zoom(n, max(factor, 1 / factor), dtype),
    "zoom_out": lambda n, factor=2.0, dtype=torch.float64: zoom(n, min(factor, 1 / factor), dtype),
}


def preset_trajectory(name: str, num_frames: int, **options: Any) -> Trajectory:
    """``preset_trajectory("orbit", 49, degrees=90)``; names: see ``PRESETS`` (from a command line's
    ``NAME[:AMOUNT]``: :func:`mmpos.camera.vocabulary.parse_motion`)."""
    check_choice("name", name, tuple(PRESETS))
    return PRESETS[name](num_frames, **options)
