"""Cameras from the short specs a command line gives (moved from ``mmpos.viz.cameras``): a trajectory named by a
file or ``preset:NAME``, and the camera model of one of its frames (its pinhole, or a unified fisheye)."""

from __future__ import annotations

import math
from pathlib import Path

from .fisheye import UnifiedCamera
from .perspective import Pinhole
from .trajectory import Trajectory, load_trajectory
from .vocabulary import is_motion, motion_trajectory, parse_motion, vocabulary_help

__all__ = ["frame_camera", "resolve_trajectory"]


def resolve_trajectory(spec: str, num_frames: int = 49) -> Trajectory:
    """A trajectory file (RealEstate10K ``.txt`` or mmpos ``.json``) or a motion ``[preset:]NAME[:AMOUNT]`` of
    :mod:`.vocabulary` (``orbit:35``, ``dolly:-0.5``, ...); an existing file of that name wins."""
    if spec.startswith("preset:") or (is_motion(spec) and not Path(spec).exists()):
        return motion_trajectory(parse_motion(spec), num_frames)
    if not Path(spec).exists():
        raise FileNotFoundError(
            f"trajectory {spec!r} not found; pass a RealEstate10K .txt, an mmpos .json, or "
            f"a camera motion preset:NAME[:AMOUNT] (the prefix is optional): {vocabulary_help()}"
        )
    return load_trajectory(spec)


def frame_camera(
    trajectory: Trajectory,
    frame: int,
    width: int,
    height: int,
    model: str = "pinhole",
    fov: float | None = None,
    xi: float = 0.0,
) -> Pinhole | UnifiedCamera:
    """The camera model of ``frame``: the trajectory's pinhole, or a unified camera of ``fov``/``xi`` (``fov``
    defaults to the frame's horizontal field of view)."""
    if model == "pinhole":
        return trajectory.camera(frame, width, height)
    if model != "unified":
        raise ValueError(f"model={model!r} is not supported; expected 'pinhole' or 'unified'")
    if fov is None:
        fov = math.degrees(2 * math.atan(0.5 / float(trajectory.intrinsics[frame, 0])))
    return UnifiedCamera.from_fov(width, height, fov, xi)
