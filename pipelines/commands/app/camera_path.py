"""Camera paths authored in the page: keyboard-style actions (``forward 0.5; turn 30; strafe -0.2``), each a
keyframe reached from the previous one, resampled to the clip's frames (rotations along the geodesic)."""

from __future__ import annotations

import math

ACTIONS = {  # name -> (what the amount is, camera axis: OpenCV x right, y down, z forward)
    "forward": "scene units along the view direction (negative: back)",
    "strafe": "scene units to the right (negative: left)",
    "rise": "scene units up (negative: down)",
    "turn": "degrees to the right (negative: left)",
    "tilt": "degrees up (negative: down)",
}


def parse_actions(text: str) -> list[tuple[str, float]]:
    """``"forward 0.5; turn 30"`` (``;``, ``,`` or new lines between actions) -> ``[("forward", 0.5), ("turn",
    30.0)]``; a ValueError naming ``actions`` and what was expected otherwise."""
    steps = []
    for part in text.replace("\n", ";").replace(",", ";").split(";"):
        words = part.split()
        if not words:
            continue
        expected = "ACTION AMOUNT with ACTION one of " + ", ".join(ACTIONS)
        if len(words) != 2 or words[0].lower() not in ACTIONS:
            raise ValueError(f"actions: {part.strip()!r}: expected {expected}")
        try:
            amount = float(words[1])
        except ValueError:
            raise ValueError(f"actions: {part.strip()!r}: the amount {words[1]!r} is not a number") from None
        if not math.isfinite(amount):
            raise ValueError(f"actions: {part.strip()!r}: the amount must be finite")
        steps.append((words[0].lower(), amount))
    if not steps:
        raise ValueError(f"actions: expected at least one action ({', '.join(ACTIONS)}), got {text!r}")
    return steps


def action_trajectory(actions: list[tuple[str, float]], fov_degrees: float = 60.0):
    """A :class:`~mmpos.camera.Trajectory` of ``len(actions) + 1`` keyframes from the identity camera: each action
    moves (``forward``, ``strafe``, ``rise``) or turns (``turn`` about the camera's down axis, ``tilt`` about its
    right axis) the previous keyframe in its own frame; square pixels, horizontal field of view ``fov_degrees``."""
    import torch

    from mmpos.camera import Trajectory
    from mmpos.camera.presets import base_intrinsics

    pose = torch.eye(4, dtype=torch.float64)
    poses = [pose]
    for name, amount in actions:
        step = torch.eye(4, dtype=torch.float64)
        if name in ("turn", "tilt"):
            angle = math.radians(amount)
            c, s = math.cos(angle), math.sin(angle)
            if name == "turn":  # about +y (down): +z turns towards +x, the right
                step[:3, :3] = torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=torch.float64)
            else:  # about +x (right): +z turns towards -y, up
                step[:3, :3] = torch.tensor([[1, 0, 0], [0, c, -s], [0, s, c]], dtype=torch.float64)
        else:
            axis = {"forward": 2, "strafe": 0, "rise": 1}[name]
            step[axis, 3] = -amount if name == "rise" else amount  # rise goes against +y (down)
        pose = pose @ step
        poses.append(pose)
    return Trajectory(torch.stack(poses), base_intrinsics(len(poses), fov_degrees=fov_degrees, aspect=1.0))
