"""Camera following of the world video model, measured against ground truth.

Each test clip is a held-out scene (test seeds) filmed along one commanded motion of :data:`EVAL_MOTIONS` (the
sign drawn per scene). The model gets the clip's first frame and, with an adapter, the trajectory; it is scored
against the ground-truth render of that trajectory (PSNR of frames 1..) and against the trajectory itself
(RotErr / TransErr, :mod:`mmpos.eval.camera_following`). Conditions:

- ``ground truth``: the render itself through the OpenCV measurement (the floor of RotErr / TransErr);
- ``no camera``: the base model alone (it cannot know the motion);
- ``<adapter>``: the base with a trained camera adapter told the trajectory;
- ``<adapter>, wrong path``: the same adapter told the opposite motion (negated amount), scored against the true
  one: following the camera must make this worse than ``no camera``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..world.nvs_data import scene_seeds
from ..world.scene3d import sample_scene3d
from ..world.video_data import CLIP_FRAMES, CLIP_SIZE, Motion, motion_trajectory, render_clip, start_pose
from .camera_following import clip_camera_errors
from .image_quality import psnr

EVAL_MOTIONS = {"orbit": 35.0, "dolly": 1.0, "pan": 20.0}


@dataclass
class EvalClip:
    seed: int
    motion: Motion
    trajectory: object  # mmpos.camera.Trajectory
    truth: np.ndarray  # uint8 [F, S, S, 3]

    def wrong(self) -> Motion:
        return Motion(self.motion.kind, -self.motion.amount)


def eval_clips(
    scenes: int, motions=tuple(EVAL_MOTIONS), frames: int = CLIP_FRAMES, size: int = CLIP_SIZE
) -> list[EvalClip]:
    """One clip per test scene and motion, deterministic."""
    clips = []
    for seed in scene_seeds("test", scenes):
        scene = sample_scene3d(seed, 4, textured=True)
        rng = np.random.default_rng([seed, 4])
        for kind in motions:
            motion = Motion(kind, float(rng.choice([-1.0, 1.0])) * EVAL_MOTIONS[kind])
            trajectory = motion_trajectory(motion, start_pose(rng.uniform(0.0, 360.0)), frames)
            truth = render_clip(scene, trajectory, size).permute(0, 2, 3, 1).numpy()
            clips.append(EvalClip(seed, motion, trajectory, truth))
    return clips


def generate(pipe, clip: EvalClip, camera=None, steps: int = 24, seed: int = 0) -> np.ndarray:
    """``[F, S, S, 3]`` float in [0, 1]: the clip generated from its first frame (and ``camera``)."""
    first = torch.from_numpy(clip.truth[0]).permute(2, 0, 1)[None].float() / 255
    size = clip.truth.shape[1]
    options = {} if camera is None else dict(camera=camera)
    return pipe(
        first,
        num_frames=len(clip.truth),
        height=size,
        width=size,
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
        **options,
    ).frames[0]


def as_unit_float(frames) -> np.ndarray:
    """Frames as float64 in [0, 1]: uint8 ones divided by 255, float ones as they are."""
    frames = np.asarray(frames)
    return frames / 255.0 if np.issubdtype(frames.dtype, np.integer) else frames.astype(np.float64)


def score(frames: np.ndarray, clip: EvalClip) -> dict:
    """PSNR (dB, frames 1.. against the render), RotErr and TransErr (degrees) against the commanded path."""
    frames = as_unit_float(frames)
    truth = clip.truth.astype(np.float64) / 255
    value = psnr(torch.from_numpy(frames[1:]).permute(0, 3, 1, 2), torch.from_numpy(truth[1:]).permute(0, 3, 1, 2))
    return dict(psnr=float(value.mean()), **clip_camera_errors(frames, clip.trajectory))


def evaluate_conditions(pipe, adapters: dict, clips: list[EvalClip], steps: int = 24, progress: bool = True):
    """``{condition: [per-clip score dict]}`` and ``{condition: [frames]}`` for every condition of the module;
    ``adapters`` maps a name to a loaded :class:`CameraAdapter`."""
    from tqdm.auto import tqdm

    scores, outputs = {}, {}

    def add(name, frames, clip):
        scores.setdefault(name, []).append(dict(score(frames, clip), motion=clip.motion.kind))
        outputs.setdefault(name, []).append(frames)

    pipe.set_progress_bar_config(disable=True)
    for index, clip in enumerate(tqdm(clips, desc="camera following", disable=not progress)):
        add("ground truth", clip.truth, clip)
        pipe.camera_adapter = None
        add("no camera", generate(pipe, clip, None, steps, index), clip)
        for name, adapter in adapters.items():
            pipe.camera_adapter = adapter
            add(name, generate(pipe, clip, clip.trajectory, steps, index), clip)
            wrong = motion_trajectory(clip.wrong(), clip.trajectory.c2w[0], len(clip.truth))
            add(f"{name}, wrong path", generate(pipe, clip, wrong, steps, index), clip)
    pipe.camera_adapter = None
    return scores, outputs


def summarise(scores: dict) -> dict:
    """``{condition: {metric: mean, metric_std: spread over clips, per_motion: {...}}}`` (NaNs skipped)."""
    summary = {}
    for name, rows in scores.items():
        entry = {}
        for metric in ("psnr", "rot_err", "trans_err"):
            values = np.array([r[metric] for r in rows], dtype=np.float64)
            values = values[np.isfinite(values)]
            entry[metric] = round(float(values.mean()), 3) if len(values) else None
            entry[f"{metric}_std"] = round(float(values.std()), 3) if len(values) else None
        entry["per_motion"] = {
            kind: {
                metric: _mean([r[metric] for r in rows if r["motion"] == kind])
                for metric in ("psnr", "rot_err", "trans_err")
            }
            for kind in sorted({r["motion"] for r in rows})
        }
        summary[name] = entry
    return summary


def _mean(values) -> float | None:
    values = np.array(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return round(float(values.mean()), 3) if len(values) else None
