"""Layout and repetition of a generated image against its scene's ground truth, at any output size.

Generating above the training size fails by repetition (objects duplicated, the scene tiled) and lost layout.
Measured per image (uint8 ``[S, S, 3]``) against the :class:`~mmpos.world.scene.SceneSpec` of its caption:

- ``count_error``: mean over the caption's object colours of ``|components found - objects expected|``
  (connected components of the colour's palette mask, 4-connected, at least ``min_area`` of the image);
- ``duplicated``: 1 when some caption colour has more components than objects (repetition), else 0;
- ``position_acc``: fraction of objects whose colour's largest component has its centre in the caption's
  3 x 3 cell (``top left`` ... ``bottom right``);
- ``period_ratio``: the background pattern's dominant period over the ground truth's (stripes and dots only;
  1 = the pattern drawn at the training pixel scale, ``scale`` = the whole training image zoomed in).
"""

from __future__ import annotations

import numpy as np

from ..world.render import render_scene
from ..world.scene import POSITION_WORDS, SceneSpec
from .metrics import colour_mask

MIN_AREA = 0.004  # fraction of the image: components smaller than this are noise


def connected_components(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """4-connected labels ``int [H, W]`` (0 = background, 1..n) and ``n``, by min-label propagation."""
    height, width = mask.shape
    big = height * width + 1
    labels = np.where(mask, np.arange(1, big).reshape(height, width), big)
    while True:
        padded = np.pad(labels, 1, constant_values=big)
        neighbours = np.minimum.reduce([padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2], padded[1:-1, 2:]])
        updated = np.where(mask, np.minimum(labels, neighbours), big)
        if np.array_equal(updated, labels):
            break
        labels = updated
    roots, dense = np.unique(labels[mask], return_inverse=True)
    out = np.zeros((height, width), dtype=np.int64)
    out[mask] = dense + 1
    return out, len(roots)


def colour_components(image: np.ndarray, colour: str, min_area: float = MIN_AREA) -> list[np.ndarray]:
    """Masks of the components of ``colour`` with at least ``min_area`` of the image, largest first."""
    labels, count = connected_components(colour_mask(image, colour))
    sizes = np.bincount(labels.ravel(), minlength=count + 1)[1:]
    keep = [i + 1 for i in np.argsort(-sizes) if sizes[i] >= min_area * labels.size]
    return [labels == k for k in keep]


def cell_of(mask: np.ndarray) -> str:
    """The 3 x 3 position word of a mask's centre."""
    ys, xs = np.nonzero(mask)
    size = mask.shape[0]
    row, column = (min(int(3 * (v.mean() + 0.5) / size), 2) for v in (ys, xs))
    return POSITION_WORDS[row][column]


def dominant_period(image: np.ndarray, background: str) -> float | None:
    """Pixels per cycle of the strongest non-zero spatial frequency of the background's luminance (objects
    replaced by the background's mean), ``None`` for an image without background pixels."""
    luminance = image.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    mask = colour_mask(image, background)
    if not mask.any():
        return None
    signal = np.where(mask, luminance - luminance[mask].mean(), 0.0)
    spectrum = np.abs(np.fft.fft2(signal))
    spectrum[0, 0] = 0.0
    fy, fx = np.unravel_index(np.argmax(spectrum), spectrum.shape)
    freqs = np.fft.fftfreq(image.shape[0])[fy], np.fft.fftfreq(image.shape[1])[fx]
    return float(1.0 / np.hypot(*freqs))


def layout_scores(image: np.ndarray, spec: SceneSpec, min_area: float = MIN_AREA) -> dict:
    """The scores of the module docstring for one generated ``image`` of the scene ``spec`` (any size)."""
    expected: dict[str, list] = {}
    for obj in spec.objects:
        expected.setdefault(obj.colour, []).append(obj)
    errors, duplicated, placed = [], 0, []
    for colour, objects in expected.items():
        components = colour_components(image, colour, min_area)
        errors.append(abs(len(components) - len(objects)))
        duplicated |= len(components) > len(objects)
        for obj in objects:
            placed.append(bool(components) and cell_of(components[0]) == obj.position_word(spec.size))
    scores = {
        "count_error": float(np.mean(errors)) if errors else 0.0,
        "duplicated": float(duplicated),
        "position_acc": float(np.mean(placed)) if placed else 1.0,
        "period_ratio": None,
    }
    if spec.style.background_pattern in ("stripes", "dots"):
        truth = dominant_period(render_scene(spec).image, spec.style.background)
        found = dominant_period(image, spec.style.background)
        if truth and found:
            scores["period_ratio"] = found / truth
    return scores
