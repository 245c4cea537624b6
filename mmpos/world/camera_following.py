"""How well a generated clip follows its commanded camera, measured with OpenCV (RotErr / TransErr).

The camera motion is recovered from the frames alone, as camera-control papers do: corners of the first frame
(Shi-Tomasi) tracked through the clip (pyramidal Lucas-Kanade, kept only where the backward track returns within
a pixel), then for each frame ``k`` the essential matrix between frame 0 and frame ``k`` (RANSAC) and
``recoverPose``. Frames are upscaled before tracking (32 px is too small for corner detection). Errors:

- RotErr: the angle (degrees) of ``R_est^T R_true``, the relative rotation from frame 0 to frame ``k``;
- TransErr: the angle (degrees) between the recovered and the commanded translation directions (monocular
  motion has no scale); undefined (NaN) where the commanded camera does not move (a pan).

Running the same measurement on the ground-truth render of the trajectory gives the floor of the method.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..camera import Trajectory, invert_pose

MIN_TRACKS = 8
RANSAC_PIXELS = 1.0  # inlier threshold, in upscaled pixels


def relative_motion(trajectory: Trajectory, frame: int) -> tuple[np.ndarray, np.ndarray]:
    """``(R [3, 3], t [3])`` taking camera-0 coordinates to camera-``frame`` ones (OpenCV's ``recoverPose``
    convention: ``x_k = R x_0 + t``)."""
    relative = (invert_pose(trajectory.c2w[frame].double()) @ trajectory.c2w[0].double()).numpy()
    return relative[:3, :3], relative[:3, 3]


def _gray(frame: np.ndarray, upscale: int) -> np.ndarray:
    import cv2

    image = np.ascontiguousarray(frame)
    if image.dtype != np.uint8:
        image = np.clip(np.rint(image * 255), 0, 255).astype(np.uint8)
    gray = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    return cv2.resize(gray, None, fx=upscale, fy=upscale, interpolation=cv2.INTER_CUBIC)


def track_corners(frames: np.ndarray, upscale: int = 4):
    """``frames [F, H, W, 3]`` (uint8 or float in [0, 1]) -> ``(points [F, N, 2], alive [N])``: first-frame
    corners tracked through the clip in upscaled pixels; ``alive`` marks tracks that held in every frame."""
    import cv2

    grays = [_gray(f, upscale) for f in frames]
    corners = cv2.goodFeaturesToTrack(grays[0], maxCorners=300, qualityLevel=0.01, minDistance=3)
    if corners is None:
        return np.zeros((len(frames), 0, 2), np.float32), np.zeros(0, bool)
    points = [corners.reshape(-1, 2).astype(np.float32)]
    alive = np.ones(len(points[0]), bool)
    lk = dict(winSize=(21, 21), maxLevel=3, criteria=(cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 30, 0.01))
    for previous, current in zip(grays[:-1], grays[1:]):
        forward, found, _ = cv2.calcOpticalFlowPyrLK(previous, current, points[-1], None, **lk)
        backward, found_back, _ = cv2.calcOpticalFlowPyrLK(current, previous, forward, None, **lk)
        returned = np.linalg.norm(backward - points[-1], axis=1) < 1.0
        alive &= found.ravel().astype(bool) & found_back.ravel().astype(bool) & returned
        points.append(forward)
    return np.stack(points), alive


def rotation_angle(rotation: np.ndarray) -> float:
    """Angle (degrees) of a rotation matrix."""
    return math.degrees(math.acos(float(np.clip((np.trace(rotation) - 1) / 2, -1.0, 1.0))))


def direction_angle(a: np.ndarray, b: np.ndarray) -> float:
    """Angle (degrees) between two vectors (NaN if either is ~0)."""
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na < 1e-9 or nb < 1e-9:
        return math.nan
    return math.degrees(math.acos(float(np.clip(a @ b / (na * nb), -1.0, 1.0))))


def camera_errors(frames, trajectory: Trajectory, upscale: int = 4) -> dict:
    """RotErr and TransErr (degrees) of each frame ``k >= 1`` of ``frames [F, H, W, 3]`` against the motion
    ``trajectory`` commands from frame 0 to frame ``k`` (see the module); NaN where fewer than
    :data:`MIN_TRACKS` tracks survive or the pose cannot be recovered. Returns ``rot_err [F-1]``,
    ``trans_err [F-1]``, their means over the defined frames and ``tracks``."""
    import cv2

    frames = frames.numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
    count, height, width = frames.shape[:3]
    if count != len(trajectory):
        raise ValueError(f"frames has {count} frames but trajectory has {len(trajectory)} poses")
    points, alive = track_corners(frames, upscale)
    k = trajectory.intrinsic_matrices(width * upscale, height * upscale)
    rot_err, trans_err = np.full(count - 1, np.nan), np.full(count - 1, np.nan)
    for i in range(1, count):
        first, moved = points[0][alive].astype(np.float64), points[i][alive].astype(np.float64)
        if len(first) < MIN_TRACKS:
            continue
        intrinsics = k[i].numpy()
        normalised = [cv2.undistortPoints(p.reshape(-1, 1, 2), intrinsics, None).reshape(-1, 2)
                      for p in (first, moved)]
        essential, inliers = cv2.findEssentialMat(normalised[0], normalised[1], np.eye(3), method=cv2.RANSAC,
                                                  prob=0.999, threshold=RANSAC_PIXELS / intrinsics[0, 0])
        if essential is None or essential.shape != (3, 3):
            continue
        _, rotation, translation, _ = cv2.recoverPose(essential, normalised[0], normalised[1], np.eye(3),
                                                      mask=inliers)
        true_rotation, true_translation = relative_motion(trajectory, i)
        rot_err[i - 1] = rotation_angle(rotation.T @ true_rotation)
        trans_err[i - 1] = direction_angle(translation.ravel(), true_translation)
    return dict(rot_err=rot_err, trans_err=trans_err, tracks=int(alive.sum()),
                rot_err_mean=_nanmean(rot_err), trans_err_mean=_nanmean(trans_err))


def clip_camera_errors(frames, trajectory: Trajectory, upscale: int = 4) -> dict:
    """One RotErr and one TransErr per clip: the medians over the second half of the clip (frames
    ``k >= F // 2``, where the commanded motion is large against the 32 px frames; robust to a failed RANSAC)."""
    errors = camera_errors(frames, trajectory, upscale)
    half = len(trajectory) // 2 - 1
    return dict(rot_err=_nanmedian(errors["rot_err"][half:]), trans_err=_nanmedian(errors["trans_err"][half:]),
                tracks=errors["tracks"])


def _nanmedian(values: np.ndarray) -> float:
    defined = values[np.isfinite(values)]
    return float(np.median(defined)) if len(defined) else math.nan


def _nanmean(values: np.ndarray) -> float:
    defined = values[np.isfinite(values)]
    return float(defined.mean()) if len(defined) else math.nan
