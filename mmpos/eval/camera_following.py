"""How well a generated clip follows its commanded camera, measured with OpenCV (RotErr / TransErr).

The camera motion is recovered from the frames alone, as camera-control papers do: corners of the first frame
(Shi-Tomasi) tracked through the clip (pyramidal Lucas-Kanade, kept only where the backward track returns within
a pixel), then for each frame ``k`` the motion from frame 0 to frame ``k``: a rotation-only fit where it explains
the tracks (no measurable parallax: a pan, where the essential matrix is degenerate), else the essential matrix
(RANSAC) and ``recoverPose`` (:func:`frame_motion`). Frames are upscaled before tracking (32 px is too small for
corner detection). Errors:

- RotErr: the angle (degrees) of ``R_est^T R_true``, the relative rotation from frame 0 to frame ``k``;
- TransErr: the angle (degrees) between the recovered and the commanded translation directions (monocular
  motion has no scale); undefined (NaN) where the commanded camera does not move (a pan) or the frames show no
  translation (the rotation-only fit).

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


def bearings(normalised: np.ndarray) -> np.ndarray:
    """``[N, 2]`` normalised image coordinates -> ``[N, 3]`` unit rays."""
    rays = np.concatenate([normalised, np.ones((len(normalised), 1))], 1)
    return rays / np.linalg.norm(rays, axis=1, keepdims=True)


def kabsch_rotation(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The rotation ``R`` minimising ``sum |R s_i - t_i|^2`` over unit rays ``source, target [N, 3]``."""
    u, _, vt = np.linalg.svd(target.T @ source)
    fix = np.diag([1.0, 1.0, np.sign(np.linalg.det(u @ vt))])
    return u @ fix @ vt


def rotation_residuals(rotation: np.ndarray, first: np.ndarray, moved: np.ndarray) -> np.ndarray:
    """``[N]`` distances (normalised image units) between ``moved`` and ``first`` carried by ``rotation`` (points
    sent behind the camera get ``inf``)."""
    carried = bearings(first) @ rotation.T
    depth = carried[:, 2]
    projected = carried[:, :2] / np.where(depth > 1e-9, depth, np.nan)[:, None]
    residuals = np.linalg.norm(projected - moved, axis=1)
    return np.where(np.isfinite(residuals), residuals, np.inf)


def fit_rotation(
    first: np.ndarray, moved: np.ndarray, threshold: float, iterations: int = 200, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Rotation-only model of a camera that turns without moving (``x_k ~ R x_0``): RANSAC over 2-track samples
    (Kabsch on their rays), refit on the inliers. ``first, moved [N, 2]`` normalised coordinates, ``threshold``
    in the same units -> ``(R [3, 3], inliers [N] bool)``. Deterministic (``seed``)."""
    rays_first, rays_moved = bearings(first), bearings(moved)
    rng = np.random.default_rng(seed)
    best_rotation, best = np.eye(3), np.zeros(len(first), bool)
    for _ in range(iterations):
        sample = rng.choice(len(first), 2, replace=False)
        rotation = kabsch_rotation(rays_first[sample], rays_moved[sample])
        inliers = rotation_residuals(rotation, first, moved) < threshold
        if inliers.sum() > best.sum():
            best_rotation, best = rotation, inliers
    for _ in range(2):  # refit on the consensus, then re-count
        if best.sum() < 3:
            break
        best_rotation = kabsch_rotation(rays_first[best], rays_moved[best])
        best = rotation_residuals(best_rotation, first, moved) < threshold
    return best_rotation, best


PARALLAX_PIXELS = 1.5  # median track distance (upscaled pixels) below which a rotation alone explains a frame


def frame_motion(first: np.ndarray, moved: np.ndarray, focal: float):
    """Recovered ``(R [3, 3], t [3] or None)`` from frame 0 to a frame, from tracks ``first, moved [N, 2]`` in
    normalised coordinates (``focal`` in pixels sets the thresholds), or ``None`` if no pose is found.

    A pure rotation (a pan, or a baseline too short to show parallax) makes the essential matrix degenerate: every
    ``[t]x R`` fits the tracks, and ``recoverPose`` may return ``R`` turned 180 degrees about the arbitrary ``t``.
    So a rotation-only model is fitted first (:func:`fit_rotation`); where it carries the tracks of frame 0 onto
    the frame's to a median of :data:`PARALLAX_PIXELS` (the tracking noise: no measurable parallax), its rotation
    is returned with ``t = None``. Otherwise the essential matrix (RANSAC, :data:`RANSAC_PIXELS`) and
    ``recoverPose`` give ``R`` and the direction of ``t``.
    """
    import cv2

    rotation_only, _ = fit_rotation(first, moved, RANSAC_PIXELS / focal)
    if np.median(rotation_residuals(rotation_only, first, moved)) * focal < PARALLAX_PIXELS:
        return rotation_only, None
    essential, inliers = cv2.findEssentialMat(
        first, moved, np.eye(3), method=cv2.RANSAC, prob=0.999, threshold=RANSAC_PIXELS / focal
    )
    if essential is None or essential.shape != (3, 3):
        return None
    _, rotation, translation, _ = cv2.recoverPose(essential, first, moved, np.eye(3), mask=inliers)
    return rotation, translation.ravel()


def camera_errors(frames, trajectory: Trajectory, upscale: int = 4) -> dict:
    """RotErr and TransErr (degrees) of each frame ``k >= 1`` of ``frames [F, H, W, 3]`` against the motion
    ``trajectory`` commands from frame 0 to frame ``k`` (see the module and :func:`frame_motion`); NaN where fewer
    than :data:`MIN_TRACKS` tracks survive or the pose cannot be recovered, TransErr also NaN where the frames
    show no translation (a rotation-only fit). Returns ``rot_err [F-1]``, ``trans_err [F-1]``, their means over
    the defined frames, ``tracks`` and ``rotation_only [F-1]`` (the frames the rotation-only model explained)."""
    import cv2

    frames = frames.numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
    count, height, width = frames.shape[:3]
    if count != len(trajectory):
        raise ValueError(f"frames has {count} frames but trajectory has {len(trajectory)} poses")
    points, alive = track_corners(frames, upscale)
    k = trajectory.intrinsic_matrices(width * upscale, height * upscale)
    rot_err, trans_err = np.full(count - 1, np.nan), np.full(count - 1, np.nan)
    rotation_only = np.zeros(count - 1, bool)
    for i in range(1, count):
        first, moved = points[0][alive].astype(np.float64), points[i][alive].astype(np.float64)
        if len(first) < MIN_TRACKS:
            continue
        intrinsics = k[i].numpy()
        normalised = [cv2.undistortPoints(p.reshape(-1, 1, 2), intrinsics, None).reshape(-1, 2) for p in (first, moved)]
        motion = frame_motion(normalised[0], normalised[1], intrinsics[0, 0])
        if motion is None:
            continue
        rotation, translation = motion
        true_rotation, true_translation = relative_motion(trajectory, i)
        rot_err[i - 1] = rotation_angle(rotation.T @ true_rotation)
        rotation_only[i - 1] = translation is None
        if translation is not None:
            trans_err[i - 1] = direction_angle(translation, true_translation)
    return dict(
        rot_err=rot_err,
        trans_err=trans_err,
        tracks=int(alive.sum()),
        rotation_only=rotation_only,
        rot_err_mean=_nanmean(rot_err),
        trans_err_mean=_nanmean(trans_err),
    )


def clip_camera_errors(frames, trajectory: Trajectory, upscale: int = 4) -> dict:
    """One RotErr and one TransErr per clip: the medians over the second half of the clip (frames
    ``k >= F // 2``, where the commanded motion is large against the 32 px frames; robust to a failed RANSAC)."""
    errors = camera_errors(frames, trajectory, upscale)
    half = len(trajectory) // 2 - 1
    return dict(
        rot_err=_nanmedian(errors["rot_err"][half:]),
        trans_err=_nanmedian(errors["trans_err"][half:]),
        tracks=errors["tracks"],
    )


def _nanmedian(values: np.ndarray) -> float:
    defined = values[np.isfinite(values)]
    return float(np.median(defined)) if len(defined) else math.nan


def _nanmean(values: np.ndarray) -> float:
    defined = values[np.isfinite(values)]
    return float(defined.mean()) if len(defined) else math.nan
