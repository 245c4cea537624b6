"""Ground-truth metrics for edits in the mini-world (images uint8 ``[S, S, 3]``, masks bool ``[S, S]``).

Colours are read against the world's palette: every pixel is assigned to the colour whose pattern segment
(base colour to its shade, all patterns mix only these two) is nearest. This is exact on rendered images
(gradients included) and robust on generated ones; palette statistics and object masks follow from it.
"""

from __future__ import annotations

import numpy as np

from ..world.render import SHADE
from ..world.scene import COLOURS

COLOUR_NAMES = list(COLOURS)
_BASE = np.array([COLOURS[n] for n in COLOUR_NAMES], dtype=np.float64)  # [12, 3]
_DIRECTION = _BASE * SHADE - _BASE


def palette_labels(image: np.ndarray) -> np.ndarray:
    """``int [S, S]``: index into ``COLOUR_NAMES`` of the nearest base-to-shade segment of each pixel."""
    offset = image.astype(np.float64)[..., None, :] - _BASE  # [S, S, 12, 3]
    t = np.clip((offset * _DIRECTION).sum(-1) / (_DIRECTION**2).sum(-1), 0.0, 1.0)
    distances = ((offset - t[..., None] * _DIRECTION) ** 2).sum(-1)
    return distances.argmin(-1)


def colour_mask(image: np.ndarray, colour: str) -> np.ndarray:
    """Pixels whose nearest palette segment is ``colour``'s."""
    return palette_labels(image) == COLOUR_NAMES.index(colour)


def palette_histogram(image: np.ndarray) -> np.ndarray:
    counts = np.bincount(palette_labels(image).ravel(), minlength=len(COLOUR_NAMES)).astype(np.float64)
    return counts / counts.sum()


def palette_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Histogram intersection of palette histograms, in [0, 1] (1 = same colours in the same amounts)."""
    return float(np.minimum(palette_histogram(a), palette_histogram(b)).sum())


def texture_signature(image: np.ndarray, bins: int = 8) -> np.ndarray:
    """Mean gradient magnitude per orientation bin (``[bins]``, luminance / 255): stripes put their energy in
    one orientation, dots in all, gradients little, flat fills none."""
    luminance = image.astype(np.float64) @ np.array([0.299, 0.587, 0.114]) / 255.0
    dy, dx = np.gradient(luminance)
    angle = np.mod(np.arctan2(dy, dx), np.pi)
    index = np.minimum((angle / np.pi * bins).astype(int), bins - 1)
    return np.bincount(index.ravel(), weights=np.hypot(dx, dy).ravel(), minlength=bins) / luminance.size


def texture_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """``1 - |sa - sb|_1 / (|sa|_1 + |sb|_1)`` of texture signatures, in [0, 1] (1 = same; two flat images: 1)."""
    sa, sb = texture_signature(a), texture_signature(b)
    total = np.abs(sa).sum() + np.abs(sb).sum()
    return float(1.0 - np.abs(sa - sb).sum() / total) if total > 0 else 1.0


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def foreground_mask(image: np.ndarray, background: str) -> np.ndarray:
    """Pixels not in the background colour (or its shade)."""
    return ~colour_mask(image, background)


def layout_copy(output: np.ndarray, reference_masks: np.ndarray, background: str) -> float:
    """IoU of the reference's object pixels with the output's foreground (high = layout copied)."""
    return iou(reference_masks.any(0), foreground_mask(output, background))


def insertion_scores(
    output: np.ndarray, before: np.ndarray, target_mask: np.ndarray, colour: str, region: np.ndarray
) -> dict:
    """Transplant: the object's colour mask inside ``region`` vs the ground-truth mask (IoU), mean colour
    error of those pixels (0..1), and the mean change outside ``region`` (0..1, should be ~0)."""
    found = colour_mask(output, colour) & region
    expected = np.array(COLOURS[colour], dtype=np.float64)
    pixels = output[found].astype(np.float64)
    colour_error = float(np.abs(pixels.mean(0) - expected).mean() / 255) if len(pixels) else 1.0
    return {
        "mask_iou": iou(found, target_mask),
        "colour_error": colour_error,
        "outside_change": change_outside(output, before, region),
    }


def change_outside(output: np.ndarray, before: np.ndarray, region: np.ndarray) -> float:
    """Mean absolute change (0..1) of the pixels outside ``region``."""
    return float(np.abs(output.astype(np.float64) - before.astype(np.float64))[~region].mean() / 255)
