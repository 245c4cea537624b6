"""Procedural solid textures for the 3D mini-world: brightness factors of world points (or sky directions).

A texture is a pure function of the world point, so every camera sees the same surface pattern (motion
parallax is visible and measurable). Factors lie in ``[0.55, 1]`` and multiply a surface's albedo.

    checker   alternating cells of side ``scale`` in x, y and z
    stripes   a sinusoid of period ``scale`` along a fixed oblique direction
    noise     a sum of 5 fixed oblique sinusoids (smooth value-noise look), wavelengths about ``scale``
    flat      1 everywhere (the untextured look)
"""

from __future__ import annotations

import numpy as np

TEXTURES = ("flat", "checker", "stripes", "noise")
_LOW = 0.55
_NOISE_DIRECTIONS = np.array([[0.9, 0.3, 0.2], [-0.4, 0.8, 0.5], [0.2, -0.5, 0.9], [0.7, 0.6, -0.4], [-0.6, 0.1, 0.8]])
_NOISE_FREQUENCIES = np.array([1.0, 1.7, 2.3, 3.1, 4.3])
_NOISE_PHASES = np.array([0.3, 1.9, 4.1, 2.7, 5.5])
_STRIPE_DIRECTION = np.array([0.8, 0.36, 0.48])


def check_texture(name: str) -> str:
    if name not in TEXTURES:
        raise ValueError(f"texture must be one of {TEXTURES}, got {name!r}")
    return name


def solid_texture(name: str, points: np.ndarray, scale: float = 0.25) -> np.ndarray:
    """Brightness factor ``[N]`` in ``[0.55, 1]`` of ``texture name`` at world ``points [N, 3]``."""
    check_texture(name)
    if name == "flat":
        return np.ones(points.shape[:-1])
    if name == "checker":
        cells = np.floor(points / scale).astype(np.int64).sum(-1)
        return np.where(cells % 2 == 0, 1.0, _LOW)
    if name == "stripes":
        wave = 0.5 + 0.5 * np.sin(2 * np.pi * (points @ _STRIPE_DIRECTION) / scale)
    else:
        angles = 2 * np.pi * (points @ _NOISE_DIRECTIONS.T) * _NOISE_FREQUENCIES / (4 * scale) + _NOISE_PHASES
        wave = 0.5 + 0.5 * np.sin(angles).mean(-1) * 1.6
    return _LOW + (1.0 - _LOW) * np.clip(wave, 0.0, 1.0)


def sky_texture(name: str, directions: np.ndarray) -> np.ndarray:
    """Brightness factor ``[N]`` of the sky (infinitely far: a function of the unit ray ``directions [N, 3]``
    only): ``stripes`` are 24 vertical bands in azimuth with a horizon gradient, anything else is flat."""
    check_texture(name)
    if name == "flat":
        return np.ones(directions.shape[:-1])
    azimuth = np.arctan2(directions[..., 0], directions[..., 2])
    bands = 0.5 + 0.5 * np.sign(np.sin(12 * azimuth))
    elevation = np.clip(-directions[..., 1], 0.0, 1.0)  # up is -y
    return np.clip(0.7 + 0.3 * bands - 0.25 * elevation, _LOW, 1.0)
