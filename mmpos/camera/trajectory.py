"""Camera trajectories: a pose and pinhole intrinsics per frame, with RealEstate10K text and JSON files.

RealEstate10K layout (one file per clip): the first line is the video URL (a file without it, whose first
line is already a pose line, is read too), then one line per frame with
19 numbers: ``timestamp fx fy cx cy 0 0 w2c[0, :] w2c[1, :] w2c[2, :]``: the timestamp in microseconds,
intrinsics normalised by the image width (fx, cx) and height (fy, cy), two unused zeros, and the 3x4
world-to-camera matrix row-major in OpenCV axes.

JSON layout (``mmpos.trajectory`` version 1)::

    {"format": "mmpos.trajectory", "version": 1, "convention": "opencv", "pose": "c2w", "url": "",
     "frames": [{"timestamp": 0, "c2w": [[...4 numbers] x 4], "intrinsics": [fx/W, fy/H, cx/W, cy/H]}, ...]}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import torch

from .._atomic import written_atomically
from .._validation import check_finite, check_float_coords
from .models import Pinhole
from .poses import check_pose, complete_pose, invert_pose

PathLike = Union[str, "os.PathLike[str]"]

RE10K_COLUMNS = 19
JSON_FORMAT = "mmpos.trajectory"


@dataclass(eq=False)
class Trajectory:
    """``c2w [N, 4, 4]`` (OpenCV axes), ``intrinsics [N, 4]`` normalised ``(fx/W, fy/H, cx/W, cy/H)``,
    ``timestamps [N]`` (float64; microseconds in RealEstate10K files), ``url`` (source, may be empty)."""

    c2w: torch.Tensor
    intrinsics: torch.Tensor
    timestamps: torch.Tensor = None  # type: ignore[assignment]  # None: 0, 1, ... (set by __post_init__)
    url: str = ""

    def __post_init__(self) -> None:
        self.c2w = check_pose("c2w", self.c2w)
        if self.c2w.dim() != 3:
            raise ValueError(f"c2w must be [N, 4, 4], got {tuple(self.c2w.shape)}")
        n = self.c2w.shape[0]
        check_float_coords("intrinsics", self.intrinsics)
        if self.intrinsics.shape != (n, 4):
            raise ValueError(
                f"intrinsics must be [N={n}, 4] (fx/W, fy/H, cx/W, cy/H), got {tuple(self.intrinsics.shape)}"
            )
        check_finite("intrinsics", self.intrinsics)
        if not bool((self.intrinsics[:, :2] > 0).all()):
            raise ValueError("intrinsics: focal lengths (columns 0 and 1) must be positive")
        if self.timestamps is None:
            self.timestamps = torch.arange(n, dtype=torch.float64)
        elif self.timestamps.shape != (n,):
            raise ValueError(f"timestamps must be [N={n}], got {tuple(self.timestamps.shape)}")
        else:
            check_finite("timestamps", self.timestamps)

    def __len__(self) -> int:
        return self.c2w.shape[0]

    @property
    def w2c(self) -> torch.Tensor:
        return invert_pose(self.c2w)

    def camera(self, index: int, width: float, height: float) -> Pinhole:
        """Pinhole camera of frame ``index`` for a ``width x height`` image."""
        fx, fy, cx, cy = self.intrinsics[index].tolist()
        return Pinhole(fx * width, fy * height, cx * width, cy * height, width, height)

    def intrinsic_matrices(self, width: float, height: float) -> torch.Tensor:
        """``K [N, 3, 3]`` in pixels for a ``width x height`` image."""
        scale = torch.tensor([width, height, width, height], dtype=self.intrinsics.dtype)
        fx, fy, cx, cy = (self.intrinsics * scale).unbind(-1)
        zero, one = torch.zeros_like(fx), torch.ones_like(fx)
        return torch.stack([fx, zero, cx, zero, fy, cy, zero, zero, one], -1).unflatten(-1, (3, 3))

    def to(self, dtype: torch.dtype) -> "Trajectory":
        return Trajectory(self.c2w.to(dtype), self.intrinsics.to(dtype), self.timestamps, self.url)


def resample(trajectory: Trajectory, num_frames: int) -> Trajectory:
    """The trajectory at ``num_frames`` evenly spaced times from its first to its last frame.

    Between two frames the rotation follows the geodesic (constant angular speed about one axis), the camera
    centre, intrinsics and timestamps move linearly. Resampling to the same count returns the same poses.
    """
    from .._validation import check_positive_int
    from .poses import axis_angle_to_matrix, matrix_to_axis_angle, pose_from_rotation_translation

    check_positive_int("num_frames", num_frames)
    n = len(trajectory)
    c2w = trajectory.c2w
    t = torch.linspace(0, n - 1, num_frames, dtype=torch.float64)  # one frame: t = 0
    left = t.floor().long().clamp(max=max(n - 2, 0))
    right = (left + 1).clamp(max=n - 1)
    frac = (t - left).to(c2w.dtype)
    r_left, r_right = c2w[left, :3, :3], c2w[right, :3, :3]
    step = matrix_to_axis_angle(r_left.transpose(-1, -2) @ r_right)
    rotation = r_left @ axis_angle_to_matrix(step * frac[:, None])
    centre = torch.lerp(c2w[left, :3, 3], c2w[right, :3, 3], frac[:, None])

    def blend(values: torch.Tensor) -> torch.Tensor:
        return torch.lerp(values[left], values[right], frac.to(values.dtype).reshape(-1, *[1] * (values.dim() - 1)))

    return Trajectory(
        pose_from_rotation_translation(rotation, centre),
        blend(trajectory.intrinsics),
        blend(trajectory.timestamps),
        trajectory.url,
    )


def read_re10k(path: PathLike, dtype: torch.dtype = torch.float64) -> Trajectory:
    """Read a RealEstate10K pose file (see the module docstring)."""
    lines = read_text(path).splitlines()
    if not lines:
        raise ValueError(f"{path}: empty file; expected a URL line then {RE10K_COLUMNS}-column pose lines")
    first_is_pose = _is_pose_line(lines[0])
    url, rows = ("" if first_is_pose else lines[0].strip()), []
    for number, line in enumerate(lines, start=1):
        if (number == 1 and not first_is_pose) or not line.strip():
            continue
        values = line.split()
        if len(values) != RE10K_COLUMNS:
            raise ValueError(
                f"{path}:{number}: {len(values)} columns; a RealEstate10K pose line has "
                f"{RE10K_COLUMNS} (timestamp fx fy cx cy 0 0 and a 3x4 world-to-camera matrix)"
            )
        try:
            rows.append([float(v) for v in values])
        except ValueError:
            raise ValueError(f"{path}:{number}: non-numeric value in {line!r}") from None
    if not rows:
        raise ValueError(f"{path}: no pose lines (expected {RE10K_COLUMNS}-column lines after the URL line)")
    table = torch.tensor(rows, dtype=torch.float64)
    w2c = complete_pose(table[:, 7:].reshape(-1, 3, 4))
    check_pose(f"{path}: world-to-camera", w2c)
    return Trajectory(invert_pose(w2c).to(dtype), table[:, 1:5].to(dtype), table[:, 0], url)


def _is_pose_line(line: str) -> bool:
    values = line.split()
    if len(values) != RE10K_COLUMNS:
        return False
    try:
        [float(v) for v in values]
    except ValueError:
        return False
    return True


def write_re10k(trajectory: Trajectory, path: PathLike) -> Path:
    """Write a RealEstate10K pose file; timestamps are rounded to integers (microseconds)."""
    w2c = invert_pose(trajectory.c2w.double())[:, :3, :].reshape(-1, 12)
    lines = [trajectory.url or "https://example.invalid/mmpos"]
    for t, k, m in zip(trajectory.timestamps.tolist(), trajectory.intrinsics.double().tolist(), w2c.tolist()):
        lines.append(" ".join([str(int(round(t)))] + [repr(v) for v in k] + ["0", "0"] + [repr(v) for v in m]))
    with written_atomically(path) as temporary:
        temporary.write_text("\n".join(lines) + "\n")
    return Path(path)


def read_text(path: PathLike) -> str:
    """The UTF-8 text of ``path``; a file in another encoding (or binary) is a ValueError naming it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not a UTF-8 text file ({error.reason} at byte {error.start})") from None


def _numbers(path: PathLike, where: str, value: object, shape: tuple, expected: str) -> Any:
    """``value`` as a nested list of ``shape`` (an entry may be a tuple of allowed lengths) holding only numbers
    (not strings, not bools); ValueError ``{path}: {where} must be {expected}`` otherwise."""
    if len(shape) == 0:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: {where} must be a number, got {value!r}")
        return value
    lengths = shape[0] if isinstance(shape[0], tuple) else (shape[0],)
    if not (isinstance(value, list) and len(value) in lengths):
        raise ValueError(f"{path}: {where} must be {expected}, got {value!r:.80}")
    return [_numbers(path, f"{where}[{i}]", item, shape[1:], expected) for i, item in enumerate(value)]


def read_json(path: PathLike, dtype: torch.dtype = torch.float64) -> Trajectory:
    """Read an ``mmpos.trajectory`` JSON file (see the module docstring); a wrong layout is a ValueError naming
    the file and the field."""
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(data, dict) or data.get("format") != JSON_FORMAT:
        raise ValueError(f'{path}: not a {JSON_FORMAT} file (missing "format": "{JSON_FORMAT}")')
    if data.get("convention", "opencv") != "opencv" or data.get("pose", "c2w") != "c2w":
        raise ValueError(
            f"{path}: expected convention 'opencv' and pose 'c2w', got "
            f"{data.get('convention')!r} / {data.get('pose')!r}"
        )
    frames = data.get("frames")
    if not isinstance(frames, list) or not frames:
        raise ValueError(f"{path}: frames must be a non-empty list of frame objects, got {frames!r:.80}")
    poses: list[list[list[float]]] = []
    rows: list[list[float]] = []
    timestamps: list[float] = []
    for i, frame in enumerate(frames):
        if not isinstance(frame, dict):
            raise ValueError(f"{path}: frames[{i}] must be an object with c2w and intrinsics, got {frame!r:.80}")
        poses.append(_numbers(path, f"frames[{i}].c2w", frame.get("c2w"), ((3, 4), 4), "a 4x4 (or 3x4) nested list"))
        rows.append(
            _numbers(
                path, f"frames[{i}].intrinsics", frame.get("intrinsics"), (4,), "4 numbers (fx/W, fy/H, cx/W, cy/H)"
            )
        )
        timestamps.append(_numbers(path, f"frames[{i}].timestamp", frame.get("timestamp", i), (), "a number"))
    c2w = torch.stack(
        [check_pose(f"{path}: frames[{i}].c2w", torch.tensor(m, dtype=torch.float64)) for i, m in enumerate(poses)]
    )
    url = data.get("url", "")
    if not isinstance(url, str):
        raise ValueError(f"{path}: url must be a string, got {url!r:.80}")
    intrinsics = torch.tensor(rows, dtype=torch.float64)
    check_finite(f"{path}: intrinsics", intrinsics)
    return Trajectory(c2w.to(dtype), intrinsics.to(dtype), torch.tensor(timestamps, dtype=torch.float64), url)


def write_json(trajectory: Trajectory, path: PathLike) -> Path:
    """Write an ``mmpos.trajectory`` JSON file (atomically)."""
    frames = [
        {"timestamp": t, "c2w": c, "intrinsics": k}
        for t, c, k in zip(
            trajectory.timestamps.tolist(), trajectory.c2w.double().tolist(), trajectory.intrinsics.double().tolist()
        )
    ]
    data = {
        "format": JSON_FORMAT,
        "version": 1,
        "convention": "opencv",
        "pose": "c2w",
        "url": trajectory.url,
        "frames": frames,
    }
    with written_atomically(path) as temporary:
        temporary.write_text(json.dumps(data, indent=1))
    return Path(path)


def load_trajectory(path: PathLike, dtype: torch.dtype = torch.float64) -> Trajectory:
    """Read ``.json`` (mmpos) or anything else as a RealEstate10K text file."""
    return read_json(path, dtype) if str(path).endswith(".json") else read_re10k(path, dtype)


def save_trajectory(trajectory: Trajectory, path: PathLike) -> Path:
    """Write ``.json`` (mmpos) or anything else as a RealEstate10K text file."""
    return write_json(trajectory, path) if str(path).endswith(".json") else write_re10k(trajectory, path)
