"""Video clips with camera paths for training camera adapters.

Layout (the one camera-control work uses for RealEstate10K; ``mmpos world clip --out DATA/clip_x`` writes it)::

    DATA/
      clip_x/
        frame_000.png, frame_001.png, ...   frames in name order (PNG or JPEG)
        cameras.txt | <id>.txt              RealEstate10K pose file, one line per frame
          or trajectory.json                mmpos trajectory (what `mmpos world clip` writes)
        caption.txt                         optional; default: an empty prompt

A sample takes ``num_frames`` evenly spaced frames (repeating frames of shorter clips), resizes them to the
training size and resamples the path at the same times. ``zoom`` augmentation (UCPE's random focal lengths)
crops the centre by a random factor and scales the intrinsics to match, so images and cameras stay consistent.
``lens`` augmentation (UCPE's random camera models, :mod:`mmpos.camera.lens_augment`) re-renders each frame with another
camera model (pinhole, OpenCV radial, unified) and returns that model with the poses, for the adapter's rays.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..camera import Trajectory, load_trajectory
from ..camera.trajectory import read_text
from ..camera.video import CameraPath

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


@dataclass(eq=False)
class Clip:
    folder: Path
    frames: list
    trajectory: Trajectory
    caption: str


def find_clips(root) -> list[Clip]:
    """Every clip folder under ``root`` (sorted by name); each must have frames and one pose file."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"data folder {root} not found")
    clips = [read_clip(folder) for folder in sorted(p for p in root.iterdir() if p.is_dir())]
    if not clips:
        raise ValueError(f"data folder {root} has no clip folders (frames + a pose file each)")
    return clips


def read_clip(folder: Path) -> Clip:
    frames = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    poses = (
        [folder / "trajectory.json"]
        if (folder / "trajectory.json").is_file()
        else sorted(p for p in folder.glob("*.txt") if p.name != "caption.txt")
    )
    if not frames or len(poses) != 1:
        raise ValueError(
            f"clip {folder}: expected frames (.png/.jpg) and one pose file (RealEstate10K .txt or "
            f"trajectory.json), found {len(frames)} frame(s) and {len(poses)} pose file(s)"
        )
    trajectory = load_trajectory(poses[0])
    if len(trajectory) != len(frames):
        raise ValueError(f"clip {folder}: {len(frames)} frames but {len(trajectory)} poses in {poses[0].name}")
    caption_file = folder / "caption.txt"
    caption = read_text(caption_file).strip() if caption_file.is_file() else ""
    return Clip(folder, frames, trajectory, caption)


def frame_indices(length: int, num_frames: int) -> list[int]:
    return np.linspace(0, length - 1, num_frames).round().astype(int).tolist()


def load_sample(clip: Clip, num_frames: int, size, zoom: float = 1.0, lens: dict | None = None):
    """``(video [3, F, H, W] in [-1, 1], trajectory of F frames, caption)``; ``zoom >= 1`` crops the centre
    ``1 / zoom`` of each frame (focal lengths times ``zoom``). With ``lens`` (:meth:`LensAugmentation.sample`)
    the frames are re-rendered by that camera model instead and the camera is a :class:`CameraPath` (poses and
    the per-frame models at ``size``)."""
    from PIL import Image

    if lens is not None:
        return _load_with_lens(clip, num_frames, size, lens)
    height, width = size
    picks = frame_indices(len(clip.frames), num_frames)
    images = []
    for i in picks:
        image = Image.open(clip.frames[i]).convert("RGB")
        if zoom != 1.0:
            w, h = image.size
            cw, ch = w / zoom, h / zoom
            image = image.crop(((w - cw) / 2, (h - ch) / 2, (w + cw) / 2, (h + ch) / 2))
        images.append(np.asarray(image.resize((width, height), Image.BICUBIC), dtype=np.float32))
    video = _as_video(images)
    trajectory = clip.trajectory
    intrinsics = trajectory.intrinsics[picks].clone()
    intrinsics[:, :2] *= zoom
    intrinsics[:, 2:] = (intrinsics[:, 2:] - 0.5) * zoom + 0.5
    return video, Trajectory(trajectory.c2w[picks], intrinsics), clip.caption


def _as_video(frames: list) -> torch.Tensor:
    """``F`` float ``[H, W, 3]`` arrays in ``[0, 255]`` -> ``[3, F, H, W]`` in ``[-1, 1]``."""
    return torch.from_numpy(np.stack(frames)).permute(3, 0, 1, 2) / 127.5 - 1.0


def _load_with_lens(clip: Clip, num_frames: int, size, lens: dict):
    from PIL import Image

    from ..camera.lens_augment import lens_camera, warp_to_camera

    height, width = size
    picks = frame_indices(len(clip.frames), num_frames)
    images, models, fitted = [], [], {}
    for i in picks:
        source = clip.trajectory.camera(i, float(width), float(height))
        if source not in fitted:  # one fit per distinct intrinsics (usually one per clip)
            fitted[source] = lens_camera(source, lens)
        image = Image.open(clip.frames[i]).convert("RGB").resize((width, height), Image.BICUBIC)
        images.append(warp_to_camera(np.asarray(image, dtype=np.float32), source, fitted[source]))
        models.append(fitted[source])
    return _as_video(images), CameraPath(clip.trajectory.c2w[picks], models), clip.caption
