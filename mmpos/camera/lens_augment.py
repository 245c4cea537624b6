"""Random camera-model augmentation for camera-adapter training (UCPE's lens augmentation): a frame shot with a
pinhole camera is re-rendered as if shot with another camera model at the same pose, and the adapter is given
that model's rays.

For every output pixel centre ``p`` of the new camera ``target``: ``ray = target.unproject(p)``, and the colour
is read at ``source.project(ray)`` in the original frame (``cv2.remap``, bilinear). The new camera is fitted
inside the original one: its focal length grows (zoom) until every pixel of its border sees a ray the source
imaged, so no pixel is invented.

    models: pinhole (focal only), opencv (radial k1, k2), unified (Mei / Geyer-Daniilidis xi: fisheye-like)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .models import CameraModel, OpenCVCamera, Pinhole, UnifiedCamera

LENS_MODELS = ("pinhole", "opencv", "unified")
FIT_GROWTH = 1.03  # zoom step while the new camera sees beyond the original frame
FIT_STEPS = 100


@dataclass(frozen=True)
class LensAugmentation:
    """Which camera models to draw (uniformly) and the ranges of their parameters.

    Args:
        models: names from :data:`LENS_MODELS`.
        max_zoom: focal lengths times ``U(1, max_zoom)`` before fitting.
        k1, k2: OpenCV radial coefficients, each ``U(low, high)``.
        xi: the unified model's ``U(low, high)``.
    """

    models: Sequence[str] = ("pinhole",)
    max_zoom: float = 1.0
    k1: tuple = (-0.2, 0.2)
    k2: tuple = (-0.05, 0.05)
    xi: tuple = (0.2, 0.9)

    def __post_init__(self) -> None:
        unknown = [m for m in self.models if m not in LENS_MODELS]
        if not self.models or unknown:
            raise ValueError(f"models={list(self.models)!r}: expected one or more of {LENS_MODELS}")
        if not self.max_zoom >= 1:
            raise ValueError(f"max_zoom must be >= 1, got {self.max_zoom!r}")
        for name in ("k1", "k2", "xi"):
            low, high = getattr(self, name)
            if not low <= high:
                raise ValueError(f"{name}=({low}, {high}): expected low <= high")

    def sample(self, generator: torch.Generator) -> dict:
        """``{"model": name, "zoom": z, **parameters}`` drawn with ``generator``."""
        draws = torch.rand(4, generator=generator, dtype=torch.float64).tolist()
        model = self.models[min(int(draws[0] * len(self.models)), len(self.models) - 1)]
        lens = {"model": model, "zoom": 1 + (self.max_zoom - 1) * draws[1]}
        if model == "opencv":
            lens.update(k1=_between(self.k1, draws[2]), k2=_between(self.k2, draws[3]))
        elif model == "unified":
            lens.update(xi=_between(self.xi, draws[2]))
        return lens


def _between(bounds: Sequence[float], u: float) -> float:
    """The point ``u`` in ``[0, 1]`` of the way from ``bounds[0]`` to ``bounds[1]``."""
    return bounds[0] + (bounds[1] - bounds[0]) * u


def lens_camera(source: Pinhole, lens: dict) -> CameraModel:
    """The camera ``lens`` describes (same image size and principal point as ``source``), its focal lengths
    ``source``'s times the smallest zoom ``>= lens["zoom"]`` at which it sees only what ``source`` imaged."""
    zoom = float(lens.get("zoom", 1.0))
    for _ in range(FIT_STEPS):
        camera = _build(source, lens, zoom)
        if camera is not None and sees_inside(camera, source):
            return camera
        zoom *= FIT_GROWTH
    raise ValueError(f"lens {lens}: no zoom up to {zoom:.1f} fits the camera inside the source frame")


def _build(source: Pinhole, lens: dict, zoom: float) -> CameraModel | None:
    """The ``lens`` camera at ``zoom`` times ``source``'s focal lengths; ``None`` where its distortion folds."""
    base = dict(
        fx=source.fx * zoom, fy=source.fy * zoom, cx=source.cx, cy=source.cy, width=source.width, height=source.height
    )
    try:
        if lens["model"] == "pinhole":
            return Pinhole(**base)
        if lens["model"] == "opencv":
            return OpenCVCamera(**base, k1=lens["k1"], k2=lens["k2"])
        if lens["model"] == "unified":
            return UnifiedCamera(**base, xi=lens["xi"])
    except ValueError:  # the distortion folds inside this image: a larger zoom may fit
        return None
    raise ValueError(f"lens model {lens['model']!r} is unknown; expected one of {LENS_MODELS}")


def pixel_centres(width: int, height: int) -> torch.Tensor:
    """``[H, W, 2]`` fp64 ``(u, v)`` of the pixel centres (``j + 0.5, i + 0.5``)."""
    v, u = torch.meshgrid(
        torch.arange(height, dtype=torch.float64) + 0.5, torch.arange(width, dtype=torch.float64) + 0.5, indexing="ij"
    )
    return torch.stack([u, v], -1)


def source_pixels(target: CameraModel, source: CameraModel) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pixels [H, W, 2] in the source image, valid [H, W])`` where each target pixel centre's ray lands."""
    rays, seen = target.unproject(pixel_centres(int(target.width), int(target.height)))
    pixels, imaged = source.project(rays)
    return pixels, seen & imaged


def sees_inside(target: CameraModel, source: CameraModel) -> bool:
    """Whether every ray of ``target`` lands inside ``source``'s image. The border decides: both maps are
    continuous and one-to-one, so the image of the border encloses the image of the rest."""
    width, height = target.width, target.height
    edge_u = torch.linspace(0, width, 4 * int(width) + 1, dtype=torch.float64)
    edge_v = torch.linspace(0, height, 4 * int(height) + 1, dtype=torch.float64)
    border = torch.cat(
        [torch.stack([edge_u, torch.full_like(edge_u, v)], -1) for v in (0.0, height)]
        + [torch.stack([torch.full_like(edge_v, u), edge_v], -1) for u in (0.0, width)]
    )
    rays, seen = target.unproject(border)
    pixels, imaged = source.project(rays)
    eps = 1e-9 * max(source.width, source.height)
    inside = (
        (pixels[..., 0] >= -eps)
        & (pixels[..., 0] <= source.width + eps)
        & (pixels[..., 1] >= -eps)
        & (pixels[..., 1] <= source.height + eps)
    )
    return bool((seen & imaged & inside).all())


def warp_to_camera(image: np.ndarray, source: CameraModel, target: CameraModel) -> np.ndarray:
    """``image [H, W, C]`` (float32, shot by ``source``) re-rendered by ``target`` (same size): bilinear,
    ``cv2.remap`` (its pixel centres are at integers, ours at ``+ 0.5``)."""
    import cv2

    pixels, _ = source_pixels(target, source)
    maps = (pixels - 0.5).to(torch.float32).numpy()
    return cv2.remap(
        np.ascontiguousarray(image, dtype=np.float32),
        maps[..., 0],
        maps[..., 1],
        cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REPLICATE,
    )
