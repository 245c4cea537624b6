"""Camera motions of the shared vocabulary (:mod:`mmpos._camera_motions`: ``orbit:35``, ``dolly:-0.5``, ...) as
trajectories."""

from __future__ import annotations

from .._camera_motions import (
    ALIASES,
    DEFAULT_AMOUNTS,
    KEYWORDS,
    MOTIONS,
    UNITS,
    CameraMotion,
    is_motion,
    parse_motion,
    vocabulary_help,
)
from .presets import preset_trajectory
from .trajectory import Trajectory

__all__ = [
    "ALIASES",
    "DEFAULT_AMOUNTS",
    "MOTIONS",
    "UNITS",
    "CameraMotion",
    "is_motion",
    "motion_trajectory",
    "parse_motion",
    "vocabulary_help",
]


def motion_trajectory(motion: CameraMotion | str, num_frames: int) -> Trajectory:
    """``num_frames`` cameras of ``motion`` (or its spec) from (for ``arc``: centred on) the identity camera."""
    if isinstance(motion, str):
        motion = parse_motion(motion)
    return preset_trajectory(motion.name, num_frames, **{KEYWORDS[motion.name]: motion.amount})
