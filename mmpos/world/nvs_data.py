"""Novel-view data from the 3D mini-world: triples (2 context views + 1 target view) of textured scenes.

Cameras stand on a ring around the scene (radius 3.5-4.5, 1.2-2.0 above the ground) looking near its centre;
the two context cameras are ``baseline`` degrees apart in azimuth and the target lies between them. Train and
test scenes come from disjoint seed ranges (:data:`TRAIN_SEEDS_START`, :data:`TEST_SEEDS_START`). Views are
ray-cast at twice the size and averaged 2x2 (anti-aliased textures). Held-out settings: wider baselines
(``baseline_degrees=(60, 80)``) and a lens not seen in training (``target_lens="unified"``: the target is a
unified-camera fisheye, xi = 1, 90 degrees, while the contexts stay pinhole).

A batch is a dict of tensors, views ordered ``(context 0, context 1, target)``:

    images      [N, 3, 3, S, S]      float32 in [0, 1]
    c2w         [N, 3, 4, 4]         float64, OpenCV axes
    intrinsics  [N, 3, 3, 3]         float64 pixel K (for the fisheye: its K, i.e. a pinhole approximation)
    patch_rays  [N, 3, P, 3]         float64 camera-frame unit rays through the patch centres (true lens)
    pixel_rays  [N, 3, S * S, 3]     float64 camera-frame unit rays through the pixel centres (true lens)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._validation import check_choice, check_positive_int
from ..camera import Pinhole, UnifiedCamera, look_at, ray_grid
from .scene3d import render_view, sample_scene3d

TRAIN_SEEDS_START, TEST_SEEDS_START = 0, 1_000_000
TRAIN_BASELINE = (20.0, 40.0)
WIDE_BASELINE = (60.0, 80.0)
LENSES = ("pinhole", "unified")
FOV_DEGREES = 60.0


def scene_seeds(split: str, count: int) -> range:
    """Seeds of the ``count`` scenes of ``split`` (``"train"`` or ``"test"``): disjoint ranges."""
    check_choice("split", split, ("train", "test"))
    check_positive_int("count", count)
    start = TRAIN_SEEDS_START if split == "train" else TEST_SEEDS_START
    if split == "train" and count > TEST_SEEDS_START:
        raise ValueError(f"count must be <= {TEST_SEEDS_START} for the train split, got {count}")
    return range(start, start + count)


def make_camera(lens: str, size: int):
    """A square ``size`` camera: ``pinhole`` (60 degrees) or ``unified`` (xi = 1, 90 degrees)."""
    check_choice("lens", lens, LENSES)
    if lens == "pinhole":
        focal = size / 2 / math.tan(math.radians(FOV_DEGREES) / 2)
        return Pinhole(focal, focal, size / 2, size / 2, size, size)
    return UnifiedCamera.from_fov(size, size, 90.0, xi=1.0)


def triple_poses(rng: np.random.Generator, baseline_degrees) -> torch.Tensor:
    """``[3, 4, 4]`` c2w of (context 0, context 1, target) on a ring around the scene."""
    baseline = math.radians(rng.uniform(*baseline_degrees))
    centre = rng.uniform(0.0, 2 * math.pi)
    azimuths = [centre - baseline / 2, centre + baseline / 2, centre + baseline * rng.uniform(-0.4, 0.4)]
    eyes, targets = [], []
    for azimuth in azimuths:
        radius, height = rng.uniform(3.5, 4.5), rng.uniform(1.2, 2.0)
        eyes.append([radius * math.sin(azimuth), -height, -radius * math.cos(azimuth)])
        targets.append([rng.uniform(-0.3, 0.3), -0.4, rng.uniform(-0.3, 0.3)])
    return look_at(torch.tensor(eyes, dtype=torch.float64), torch.tensor(targets, dtype=torch.float64))


def render_antialiased(scene, camera, c2w) -> torch.Tensor:
    """``[3, S, S]`` float32 in [0, 1]: the view ray-cast at twice the size, averaged over 2x2 pixels."""
    size = int(camera.width)
    frame = render_view(scene, camera.resized(2 * size, 2 * size), c2w)
    image = torch.from_numpy(frame.image.astype(np.float32) / 255.0).permute(2, 0, 1)
    return torch.nn.functional.avg_pool2d(image[None], 2)[0]


def make_triples(
    split: str,
    scenes: int,
    triples_per_scene: int = 4,
    size: int = 32,
    patch: int = 4,
    baseline_degrees=TRAIN_BASELINE,
    target_lens: str = "pinhole",
    objects: int = 4,
) -> dict:
    """``scenes * triples_per_scene`` triples of textured scenes of ``split`` (a batch dict, see the module)."""
    check_positive_int("triples_per_scene", triples_per_scene)
    if size % patch:
        raise ValueError(f"size must be a multiple of patch={patch}, got {size}")
    cameras = [make_camera("pinhole", size)] * 2 + [make_camera(target_lens, size)]
    grid = (size // patch, size // patch)
    patch_rays = torch.stack([ray_grid(c, grid, dtype=torch.float64)[0] for c in cameras])
    pixel_rays = torch.stack([ray_grid(c, (size, size), dtype=torch.float64)[0] for c in cameras])
    assert all(ray_grid(c, (size, size))[1].all() for c in cameras), "every pixel of these lenses has a ray"
    k = torch.stack([c.intrinsic_matrix(torch.float64) for c in cameras])
    images, poses = [], []
    for seed in scene_seeds(split, scenes):
        scene = sample_scene3d(seed, objects, textured=True)
        rng = np.random.default_rng([seed, 2, int(baseline_degrees[0]), LENSES.index(target_lens)])
        for _ in range(triples_per_scene):
            c2w = triple_poses(rng, baseline_degrees)
            images.append(torch.stack([render_antialiased(scene, c, p) for c, p in zip(cameras, c2w)]))
            poses.append(c2w)
    count = len(images)
    return dict(
        images=torch.stack(images),
        c2w=torch.stack(poses),
        intrinsics=k.expand(count, -1, -1, -1),
        patch_rays=patch_rays.expand(count, -1, -1, -1),
        pixel_rays=pixel_rays.expand(count, -1, -1, -1),
    )


def select(batch: dict, index) -> dict:
    """The triples ``index`` (a slice, list or tensor of indices) of ``batch``."""
    return {name: value[index] for name, value in batch.items()}
