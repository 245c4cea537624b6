"""Camera-moving clips of the 3D mini-world: the data of the world video model and its camera adapters.

A clip is a textured 3D scene (:func:`~mmpos.world.scene3d.sample_scene3d`) filmed along one camera motion
that starts from a camera on a ring around the scene looking at its centre. Motions are the presets users
command (:mod:`mmpos.camera.presets`): ``orbit`` (around the look-at point), ``dolly`` (in / out) and ``pan``
(turn left / right), each with a random signed amount. Frames are ray-cast at twice the size and averaged 2x2.
Train and test scenes come from disjoint seed ranges (those of :mod:`mmpos.world.nvs_data`).

A batch is a dict:

    frames      [N, F, 3, S, S]   uint8 RGB
    c2w         [N, F, 4, 4]      float64 camera-to-world, OpenCV axes
    intrinsics  [N, F, 4]         float64 normalised pinhole (fx/W, fy/H, cx/W, cy/H): a Trajectory's
    motion      [N]               int64 index into :data:`MOTIONS`
    amount      [N]               float64 signed degrees (orbit, pan) or scene units (dolly)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import check_choice, check_positive_int
from ..camera import Trajectory, invert_pose, preset_trajectory
from .nvs_data import render_antialiased, scene_seeds
from .scene3d import orbit_trajectory, sample_scene3d

MOTIONS = ("orbit", "dolly", "pan")
AMOUNTS = {"orbit": (20.0, 45.0), "dolly": (0.6, 1.4), "pan": (10.0, 25.0)}  # |amount| range per motion
RING_RADIUS, RING_HEIGHT = 3.5, 1.8
CLIP_FRAMES, CLIP_SIZE, FOV_DEGREES = 9, 32, 60.0


@dataclass(frozen=True)
class Motion:
    """A commanded camera motion: ``kind`` in :data:`MOTIONS`, a signed ``amount`` (degrees for ``orbit`` and
    ``pan``, positive turning right; scene units for ``dolly``, positive moving in)."""

    kind: str
    amount: float

    def __post_init__(self):
        check_choice("kind", self.kind, MOTIONS)
        if not math.isfinite(self.amount):
            raise ValueError(f"amount must be a finite number, got {self.amount!r}")


def start_pose(azimuth_degrees: float) -> torch.Tensor:
    """``[4, 4]`` c2w of a camera on the ring at ``azimuth_degrees``, looking at the scene centre."""
    ring = orbit_trajectory(2, RING_RADIUS, RING_HEIGHT, degrees=float(azimuth_degrees), fov_degrees=FOV_DEGREES)
    return ring.c2w[-1]


def motion_trajectory(motion: Motion, start: torch.Tensor, frames: int = CLIP_FRAMES) -> Trajectory:
    """The preset of ``motion`` placed at ``start`` (its first camera), square frames of :data:`FOV_DEGREES`."""
    check_positive_int("frames", frames)
    if motion.kind == "orbit":
        distance = math.hypot(RING_RADIUS, RING_HEIGHT - 0.4)  # to the look-at point
        relative = preset_trajectory("orbit", frames, degrees=motion.amount, radius=distance)
    elif motion.kind == "pan":
        relative = preset_trajectory("pan", frames, degrees=motion.amount)
    else:
        relative = preset_trajectory(
            "dolly_in" if motion.amount >= 0 else "dolly_out", frames, distance=abs(motion.amount)
        )
    c2w = start.to(torch.float64) @ invert_pose(relative.c2w[:1]) @ relative.c2w
    fx = 0.5 / math.tan(math.radians(FOV_DEGREES) / 2)
    intrinsics = torch.tensor([fx, fx, 0.5, 0.5], dtype=torch.float64).expand(frames, 4).clone()
    return Trajectory(c2w, intrinsics)


def random_motion(rng: np.random.Generator) -> Motion:
    """One of :data:`MOTIONS` with a random sign and size (uniform in :data:`AMOUNTS`)."""
    kind = MOTIONS[int(rng.integers(len(MOTIONS)))]
    low, high = AMOUNTS[kind]
    return Motion(kind, float(rng.choice([-1.0, 1.0]) * rng.uniform(low, high)))


def render_clip(scene, trajectory: Trajectory, size: int = CLIP_SIZE) -> torch.Tensor:
    """``[F, 3, S, S]`` uint8: ``scene`` along ``trajectory``, anti-aliased."""
    check_positive_int("size", size)
    frames = [
        render_antialiased(scene, trajectory.camera(i, size, size), trajectory.c2w[i]) for i in range(len(trajectory))
    ]
    return (torch.stack(frames) * 255).round().to(torch.uint8)


def make_clips(
    split: str,
    scenes: int,
    clips_per_scene: int = 4,
    frames: int = CLIP_FRAMES,
    size: int = CLIP_SIZE,
    objects: int = 4,
    progress: bool = False,
) -> dict:
    """``scenes * clips_per_scene`` clips of ``split`` (``"train"`` / ``"test"``), deterministic per scene seed."""
    check_positive_int("clips_per_scene", clips_per_scene)
    from tqdm.auto import tqdm

    clips, poses, intrinsics, kinds, amounts = [], [], [], [], []
    for seed in tqdm(scene_seeds(split, scenes), desc=f"rendering {split} clips", disable=not progress):
        scene = sample_scene3d(seed, objects, textured=True)
        rng = np.random.default_rng([seed, 3])
        for _ in range(clips_per_scene):
            motion = random_motion(rng)
            trajectory = motion_trajectory(motion, start_pose(rng.uniform(0.0, 360.0)), frames)
            clips.append(render_clip(scene, trajectory, size))
            poses.append(trajectory.c2w)
            intrinsics.append(trajectory.intrinsics)
            kinds.append(MOTIONS.index(motion.kind))
            amounts.append(motion.amount)
    return dict(
        frames=torch.stack(clips),
        c2w=torch.stack(poses),
        intrinsics=torch.stack(intrinsics),
        motion=torch.tensor(kinds),
        amount=torch.tensor(amounts, dtype=torch.float64),
    )


def clip_trajectory(batch: dict, index: int) -> Trajectory:
    """The :class:`~mmpos.camera.Trajectory` of clip ``index`` of ``batch``."""
    return Trajectory(batch["c2w"][index], batch["intrinsics"][index])
