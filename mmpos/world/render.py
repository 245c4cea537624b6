"""Rasterise scene specs: hard-edged shape masks and patterned fills, so masks match pixels exactly.

Everything is numpy on ``[H, W]`` pixel-centre grids; images are ``uint8 [H, W, 3]``, masks ``bool [H, W]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .scene import COLOURS, ObjectSpec, SceneSpec

SHADE = 0.55  # a pattern's second colour is the base colour times SHADE (keeps the hue recognisable)
PATTERN_PERIOD = 6  # pixels


def _regular_polygon(vertices: int, radius: float = 1.0, phase: float = -np.pi / 2) -> np.ndarray:
    angles = phase + 2 * np.pi * np.arange(vertices) / vertices
    return radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)


def _star(points: int = 5, inner: float = 0.45) -> np.ndarray:
    outer = _regular_polygon(points)
    inner_pts = _regular_polygon(points, inner, -np.pi / 2 + np.pi / points)
    return np.stack([outer, inner_pts], axis=1).reshape(-1, 2)


_ARM = 0.36
POLYGONS = {  # vertices in the unit box [-1, 1]^2, y pointing down
    "square": np.array([[-0.9, -0.9], [0.9, -0.9], [0.9, 0.9], [-0.9, 0.9]]),
    "triangle": np.array([[0.0, -1.0], [1.0, 0.9], [-1.0, 0.9]]),
    "diamond": np.array([[0.0, -1.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]),
    "hexagon": _regular_polygon(6, phase=0.0),
    "star": _star() * np.array([1.0, 1.08]) + np.array([0.0, 0.08]),
    "cross": np.array(
        [
            [-_ARM, -1],
            [_ARM, -1],
            [_ARM, -_ARM],
            [1, -_ARM],
            [1, _ARM],
            [_ARM, _ARM],
            [_ARM, 1],
            [-_ARM, 1],
            [-_ARM, _ARM],
            [-1, _ARM],
            [-1, -_ARM],
            [-_ARM, -_ARM],
        ],
        dtype=float,
    ),
}


def _inside_polygon(u: np.ndarray, v: np.ndarray, polygon: np.ndarray) -> np.ndarray:
    """Even-odd rule for points (u, v) against a closed polygon [V, 2]."""
    inside = np.zeros(u.shape, dtype=bool)
    for (ax, ay), (bx, by) in zip(polygon, np.roll(polygon, -1, axis=0)):
        crosses = (ay > v) != (by > v)
        with np.errstate(divide="ignore", invalid="ignore"):
            x_cross = ax + (v - ay) * (bx - ax) / (by - ay)
        inside ^= crosses & (u < x_cross)
    return inside


def shape_mask(shape: str, box, image_size: int) -> np.ndarray:
    """``bool [S, S]``: pixels whose centres fall inside ``shape`` drawn in ``box`` = (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = box
    centres = np.arange(image_size) + 0.5
    u = (centres[None, :] - (x0 + x1) / 2) / ((x1 - x0) / 2)
    v = (centres[:, None] - (y0 + y1) / 2) / ((y1 - y0) / 2)
    u, v = np.broadcast_arrays(u, v)
    if shape == "circle":
        return u * u + v * v <= 1.0
    return _inside_polygon(u, v, POLYGONS[shape])


def pattern_fill(pattern: str, colour: str, box, image_size: int) -> np.ndarray:
    """``uint8 [S, S, 3]`` of ``colour`` in ``pattern``, anchored at the box corner (moves with the object)."""
    base = np.array(COLOURS[colour], dtype=np.float64)
    dark = base * SHADE
    x0, y0, x1, y1 = box
    xs = np.arange(image_size)[None, :] - x0
    ys = np.arange(image_size)[:, None] - y0
    if pattern == "flat":
        weight = np.zeros((image_size, image_size))
    elif pattern == "stripes":
        weight = (((xs + ys) // (PATTERN_PERIOD // 2)) % 2).astype(np.float64)
    elif pattern == "dots":
        dx = xs % PATTERN_PERIOD - PATTERN_PERIOD / 2 + 0.5
        dy = ys % PATTERN_PERIOD - PATTERN_PERIOD / 2 + 0.5
        weight = (dx * dx + dy * dy <= 2.5).astype(np.float64)
    elif pattern == "gradient":
        weight = np.broadcast_to(np.clip((ys + 0.5) / max(y1 - y0, 1), 0.0, 1.0), (image_size, image_size))
    else:
        raise ValueError(f"pattern={pattern!r} is not supported")
    fill = base + (dark - base) * weight[..., None]
    return np.rint(fill).astype(np.uint8)


@dataclass
class Rendered:
    """An image with its ground truth: ``masks[i]`` are the pixels object ``i`` covers in the image."""

    image: np.ndarray  # uint8 [S, S, 3]
    masks: np.ndarray  # bool [K, S, S]
    spec: SceneSpec

    def boxes(self) -> list[tuple[int, int, int, int] | None]:
        """Tight boxes (x0, y0, x1, y1), end-exclusive, of each visible mask."""
        return [mask_box(m) for m in self.masks]


def mask_box(mask: np.ndarray):
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        return None
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def draw_object(image: np.ndarray, obj: ObjectSpec, pattern: str) -> np.ndarray:
    """Draw ``obj`` into ``image`` in place; returns its mask."""
    size = image.shape[0]
    mask = shape_mask(obj.shape, obj.box, size)
    image[mask] = pattern_fill(pattern, obj.colour, obj.box, size)[mask]
    return mask


def render_scene(spec: SceneSpec) -> Rendered:
    """Background, then objects in order (later objects cover earlier ones; masks say what is visible)."""
    size, style = spec.size, spec.style
    image = pattern_fill(style.background_pattern, style.background, (0, 0, size, size), size)
    masks = np.zeros((len(spec.objects), size, size), dtype=bool)
    for i, obj in enumerate(spec.objects):
        mask = draw_object(image, obj, style.object_pattern)
        masks[:i] &= ~mask
        masks[i] = mask
    return Rendered(image, masks, spec)
