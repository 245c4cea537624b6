"""Whether a generated clip follows its commanded camera, said plainly (``mmpos generate video --model world``).

The measurement is :func:`mmpos.eval.camera_following.clip_camera_errors` (RotErr / TransErr recovered from the
frames with OpenCV). A clip *follows* its motion when the recovered motion is nearer the commanded one than a
still camera is: RotErr below half the commanded rotation (a still clip has RotErr = the commanded angle), and,
where the command translates (a dolly, an orbit), a translation is seen in the frames whose direction is within
:data:`MAX_TRANS_ERR` degrees of the commanded one.
"""

from __future__ import annotations

import math

MAX_TRANS_ERR = 45.0  # degrees: a recovered translation direction nearer the command than a perpendicular one
MIN_TRANSLATION = 1e-3  # commanded camera displacement (world units) below which a motion is a pure rotation


def following(frames, trajectory) -> dict:
    """``frames [F, 3, H, W]`` or ``[F, H, W, 3]`` in [0, 1] and their commanded ``trajectory`` -> RotErr and TransErr
    (degrees, NaN: not measurable), the commanded rotation (degrees, frame 0 to the last) and ``follows`` with
    the ``reason`` in words."""
    import numpy as np
    import torch

    from mmpos.eval.camera_following import clip_camera_errors, relative_motion, rotation_angle

    frames = frames.detach().float().cpu() if isinstance(frames, torch.Tensor) else torch.as_tensor(frames)
    if frames.shape[1] == 3:
        frames = frames.permute(0, 2, 3, 1)
    errors = clip_camera_errors(frames.numpy(), trajectory)
    rotation, translation = relative_motion(trajectory, len(trajectory) - 1)
    commanded = rotation_angle(rotation)
    moves = float(np.linalg.norm(translation)) > MIN_TRANSLATION
    rot_err, trans_err = errors["rot_err"], errors["trans_err"]
    if math.isnan(rot_err):
        follows, reason = False, f"no camera motion could be recovered ({errors['tracks']} tracks held)"
    elif commanded > 1.0 and rot_err > commanded / 2:
        follows, reason = False, f"turns {rot_err:.1f} deg away from the commanded {commanded:.1f} deg rotation"
    elif moves and math.isnan(trans_err):
        follows, reason = False, "the frames show no camera translation (the command moves the camera)"
    elif moves and trans_err > MAX_TRANS_ERR:
        follows, reason = False, f"moves {trans_err:.0f} deg off the commanded direction"
    else:
        follows, reason = True, "recovered motion within half the commanded rotation and 45 deg of its direction"
    return dict(
        rot_err=_rounded(rot_err),
        trans_err=_rounded(trans_err),
        commanded_rotation=round(commanded, 2),
        tracks=errors["tracks"],
        follows=follows,
        reason=reason,
    )


def describe_following(motion: str, measured: dict) -> str:
    """One line: the metric and the verdict for ``motion``."""
    verdict = "follows" if measured["follows"] else "does NOT follow"
    errors = f"RotErr {_shown(measured['rot_err'])} deg, TransErr {_shown(measured['trans_err'])} deg"
    return f"camera following of {motion}: {errors}: the model {verdict} it ({measured['reason']})"


def _rounded(value: float):
    return None if math.isnan(value) else round(float(value), 2)


def _shown(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"
