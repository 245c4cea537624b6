"""Files of a generated video: an mp4 (OpenCV ``VideoWriter``), a grid of frames (PNG) and the camera rig plot.

Every file is written to a temporary name beside its target and renamed into place, so a crash never leaves a
half-written file under the final name.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mmpos._atomic import written_atomically


def video_to_uint8(frames: torch.Tensor) -> np.ndarray:
    """``[F, 3, H, W]`` floats in ``[0, 1]`` -> ``[F, H, W, 3]`` uint8 RGB."""
    if frames.dim() != 4 or frames.shape[1] != 3:
        raise ValueError(f"frames must be [F, 3, H, W], got {tuple(frames.shape)}")
    return (frames.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def write_mp4(frames: torch.Tensor, path, fps: int = 16) -> Path:
    """Write ``frames [F, 3, H, W]`` as an mp4 (``mp4v``) at ``fps``."""
    import cv2

    rgb = video_to_uint8(frames)
    with written_atomically(path) as temporary:  # same suffix: OpenCV picks the container by it
        writer = cv2.VideoWriter(str(temporary), cv2.VideoWriter_fourcc(*"mp4v"), float(fps),
                                 (rgb.shape[2], rgb.shape[1]))
        if not writer.isOpened():
            raise RuntimeError(f"OpenCV could not open a video writer for {temporary} (mp4v codec missing?)")
        try:
            for frame in rgb:
                writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        finally:
            writer.release()
    return Path(path)


def frame_grid(frames: torch.Tensor, count: int = 8, columns: int = 4) -> np.ndarray:
    """``count`` evenly spaced frames tiled ``columns`` wide (uint8 ``[rows * H, columns * W, 3]``)."""
    rgb = video_to_uint8(frames)
    picks = np.unique(np.linspace(0, len(rgb) - 1, min(count, len(rgb))).round().astype(int))
    columns = min(columns, len(picks))
    rows = -(-len(picks) // columns)
    height, width = rgb.shape[1:3]
    grid = np.full((rows * height, columns * width, 3), 255, dtype=np.uint8)
    for slot, index in enumerate(picks):
        r, c = divmod(slot, columns)
        grid[r * height:(r + 1) * height, c * width:(c + 1) * width] = rgb[index]
    return grid


def write_png(array: np.ndarray, path) -> Path:
    from PIL import Image

    with written_atomically(path) as temporary:
        Image.fromarray(array).save(temporary, format="PNG")
    return Path(path)


def write_rig_plot(trajectory, path, title: str) -> Path:
    """The trajectory's frusta coloured by time (:func:`mmpos.viz.cameras.plot_rig`)."""
    from mmpos.viz.cameras import plot_rig
    from mmpos.viz.figure_files import pyplot, save_figure

    fig = pyplot().figure(figsize=(6, 5))
    plot_rig(fig.add_subplot(projection="3d"), trajectory, title=title)
    return save_figure(fig, path)
