"""Image arrays of the world: uint8 ``[..., H, W, 3]`` <-> float ``[..., 3, H, W]`` in [0, 1], and PNG files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def to_chw(images: np.ndarray) -> torch.Tensor:
    """uint8 ``[..., H, W, 3]`` -> float ``[..., 3, H, W]`` in [0, 1] (what the editing pipelines take)."""
    return torch.from_numpy(np.ascontiguousarray(images)).movedim(-1, -3).float() / 255.0


def to_uint8(images) -> np.ndarray:
    """float ``[B, 3, H, W]`` tensor or ``[B, H, W, 3]`` array in [0, 1] -> uint8 ``[B, H, W, 3]`` (rounded)."""
    if isinstance(images, torch.Tensor):
        images = images.detach().float().movedim(-3, -1).cpu().numpy()
    return (np.clip(np.asarray(images), 0, 1) * 255).round().astype(np.uint8)


def save_png(path, array: np.ndarray, replace: bool = True) -> Path:
    """Write a uint8 ``[H, W, 3]`` (or ``[H, W]``) array as PNG (through a temporary name renamed into place),
    creating the folder; returns the path. ``replace=False``: a file at ``path`` is kept and
    :class:`~mmpos._atomic.OutputTakenError` raised."""
    from PIL import Image

    from .._atomic import written_atomically

    with written_atomically(path, replace=replace) as temporary:
        Image.fromarray(array).save(temporary, format="PNG")
    return Path(path)
