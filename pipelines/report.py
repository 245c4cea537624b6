"""One section of the world demo's report: image rows, captions, diagnostic figures, a note and a score table."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Section:
    title: str
    rows: list  # [(label, uint8 [N, H, W, 3])]
    captions: list = field(default_factory=list)  # one per column (or one for all)
    diagnostics: list = field(default_factory=list)  # figure paths
    note: str = ""
    table: list = field(default_factory=list)  # score rows {"method": ..., score: value} (edit_scores)
    table_note: str = ""  # what the scores measure


def error_map(output: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """uint8 ``[N, S, S, 3]`` heat map of the per-pixel max |output - truth| (black = exact, red = off)."""
    error = np.abs(output.astype(np.int16) - truth.astype(np.int16)).max(axis=-1).astype(np.float64) / 255
    heat = np.zeros(output.shape, dtype=np.uint8)
    heat[..., 0] = np.clip(error * 2 * 255, 0, 255).astype(np.uint8)
    heat[..., 1] = np.clip((error - 0.5) * 2 * 255, 0, 255).astype(np.uint8)
    return heat


def mask_image(masks: np.ndarray) -> np.ndarray:
    return np.repeat(masks[..., None].astype(np.uint8) * 255, 3, axis=-1)


def with_box(image: np.ndarray, box, colour=(255, 0, 0)) -> np.ndarray:
    """A copy of uint8 ``[S, S, 3]`` with the ``(left, top, right, bottom)`` box outlined one pixel inside."""
    left, top, right, bottom = box
    out = image.copy()
    out[top:bottom, [left, right - 1]] = colour
    out[[top, bottom - 1], left:right] = colour
    return out
