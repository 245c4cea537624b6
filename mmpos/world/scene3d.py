"""Simple 3D scenes (spheres, boxes, a ground plane) ray-cast from known pinhole cameras, and clips along
camera trajectories: images with per-pixel depth and object ids as ground truth for camera work.

Conventions (OpenCV): camera looks along +z, x right, y down; ``pose`` is camera-to-world ``[4, 4]``;
intrinsics ``K = [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]`` in pixels, pixel centres at ``(u + 0.5, v + 0.5)``.
Geometry runs in float64 numpy (small images; exactness over speed). Self-contained: it does not need
``mmpos.camera``; a camera from there converts with ``intrinsics``/``pose`` matrices.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._validation import check_positive_int
from .scene import COLOURS

LIGHT = np.array([0.4, -1.0, -0.3]) / np.linalg.norm([0.4, -1.0, -0.3])  # towards the light (up is -y)
GROUND_ID, SKY_ID = -1, -2


@dataclass(frozen=True)
class Sphere:
    centre: tuple[float, float, float]
    radius: float
    colour: str


@dataclass(frozen=True)
class Box:
    """Axis-aligned box from ``low`` to ``high`` corners."""

    low: tuple[float, float, float]
    high: tuple[float, float, float]
    colour: str


@dataclass(frozen=True)
class Scene3D:
    """Primitives standing on the ground plane ``y = ground_y`` (y points down, so objects have y < 0)."""

    primitives: tuple = field(default_factory=tuple)
    ground_y: float = 0.0
    ground_colour: str = "gray"
    sky_colour: str = "cyan"


@dataclass
class Frame:
    image: np.ndarray  # uint8 [H, W, 3]
    depth: np.ndarray  # float64 [H, W], z in camera coordinates (inf for sky)
    ids: np.ndarray  # int [H, W]: primitive index, GROUND_ID or SKY_ID
    intrinsics: np.ndarray  # [3, 3]
    pose: np.ndarray  # camera-to-world [4, 4]


def pinhole(size: int, fov_degrees: float = 60.0) -> np.ndarray:
    """Square-pixel intrinsics of a ``size`` x ``size`` image with horizontal field of view ``fov_degrees``."""
    check_positive_int("size", size)
    if not 0.0 < fov_degrees < 180.0:
        raise ValueError(f"fov_degrees must be in (0, 180), got {fov_degrees}")
    focal = size / 2 / np.tan(np.radians(fov_degrees) / 2)
    return np.array([[focal, 0.0, size / 2], [0.0, focal, size / 2], [0.0, 0.0, 1.0]])


def look_at(eye, target, up=(0.0, -1.0, 0.0)) -> np.ndarray:
    """Camera-to-world pose at ``eye`` looking at ``target`` (OpenCV axes; world up is -y)."""
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    forward = target - eye
    if np.linalg.norm(forward) == 0:
        raise ValueError("eye and target must differ")
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, up)
    if np.linalg.norm(right) < 1e-9:
        raise ValueError("the viewing direction is parallel to up; choose another eye or up")
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    pose = np.eye(4)
    pose[:3, :3] = np.stack([right, down, forward], axis=1)
    pose[:3, 3] = eye
    return pose


def camera_rays(intrinsics: np.ndarray, pose: np.ndarray, size: int):
    """``(origin [3], directions [H, W, 3])``: unit world-space rays through pixel centres."""
    v, u = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5, indexing="ij")
    pixels = np.stack([u, v, np.ones_like(u)], axis=-1)
    directions = pixels @ np.linalg.inv(intrinsics).T @ pose[:3, :3].T
    return pose[:3, 3], directions / np.linalg.norm(directions, axis=-1, keepdims=True)


def _hit_sphere(origin, directions, sphere: Sphere):
    """Distance along each ray to the sphere (inf on a miss) and the outward normals."""
    offset = origin - np.asarray(sphere.centre)
    b = directions @ offset
    c = offset @ offset - sphere.radius**2
    disc = b * b - c
    t = np.where(disc >= 0, -b - np.sqrt(np.maximum(disc, 0.0)), np.inf)
    t = np.where(t > 1e-9, t, np.inf)
    points = origin + directions * np.where(np.isfinite(t), t, 0.0)[..., None]
    return t, (points - np.asarray(sphere.centre)) / sphere.radius


def _hit_box(origin, directions, box: Box):
    """Slab test: entry distance (inf on a miss) and the normal of the entry face."""
    low, high = np.asarray(box.low), np.asarray(box.high)
    with np.errstate(divide="ignore", invalid="ignore"):
        t1, t2 = (low - origin) / directions, (high - origin) / directions
    near, far = np.minimum(t1, t2), np.maximum(t1, t2)
    t_near, t_far = near.max(-1), far.min(-1)
    t = np.where((t_near <= t_far) & (t_near > 1e-9), t_near, np.inf)
    axis = near.argmax(-1)
    normals = np.zeros(directions.shape)
    np.put_along_axis(normals, axis[..., None], -np.sign(np.take_along_axis(directions, axis[..., None], -1)), -1)
    return t, normals


def render_view(scene: Scene3D, intrinsics: np.ndarray, pose: np.ndarray, size: int) -> Frame:
    """Ray-cast ``scene``: nearest hit per pixel, Lambert shading with ambient light."""
    origin, directions = camera_rays(intrinsics, pose, size)
    best = np.full(directions.shape[:2], np.inf)
    ids = np.full(directions.shape[:2], SKY_ID)
    normals = np.zeros(directions.shape)
    albedo = np.broadcast_to(np.array(COLOURS[scene.sky_colour], dtype=np.float64), directions.shape).copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        t_ground = (scene.ground_y - origin[1]) / directions[..., 1]
    candidates = [(GROUND_ID, np.where(t_ground > 1e-9, t_ground, np.inf),
                   np.broadcast_to([0.0, -1.0, 0.0], directions.shape), scene.ground_colour)]
    for index, primitive in enumerate(scene.primitives):
        hit = _hit_sphere if isinstance(primitive, Sphere) else _hit_box
        candidates.append((index, *hit(origin, directions, primitive), primitive.colour))
    for index, t, normal, colour in candidates:
        closer = t < best
        best[closer], ids[closer] = t[closer], index
        normals[closer] = normal[closer]
        albedo[closer] = COLOURS[colour]
    shade = np.where(ids == SKY_ID, 1.0, 0.35 + 0.65 * np.clip(normals @ LIGHT, 0.0, 1.0))
    image = np.rint(np.clip(albedo * shade[..., None], 0, 255)).astype(np.uint8)
    forward = pose[:3, 2]
    depth = np.where(np.isfinite(best), best * (directions @ forward), np.inf)
    return Frame(image, depth, ids, intrinsics, pose)


def sample_scene3d(seed: int, count: int = 3) -> Scene3D:
    """Random spheres and boxes on the ground around the origin, deterministic per seed."""
    rng = np.random.default_rng(seed)
    colours = [c for c in COLOURS if c not in ("gray", "cyan")]
    primitives = []
    for i in range(count):
        x, z = rng.uniform(-1.5, 1.5, size=2)
        size = float(rng.uniform(0.3, 0.6))
        colour = str(rng.choice(colours))
        if rng.random() < 0.5:
            primitives.append(Sphere((float(x), -size, float(z)), size, colour))
        else:
            primitives.append(Box((float(x) - size, -2 * size, float(z) - size), (float(x) + size, 0.0, float(z) + size),
                                  colour))
    return Scene3D(tuple(primitives))


def orbit_poses(frames: int, radius: float = 3.5, height: float = 1.8, degrees: float = 90.0,
                target=(0.0, -0.4, 0.0)) -> list[np.ndarray]:
    """Camera-to-world poses on a horizontal arc of ``degrees`` around ``target``, looking at it."""
    check_positive_int("frames", frames)
    angles = np.radians(np.linspace(0.0, degrees, frames))
    return [look_at((radius * np.sin(a), -height, -radius * np.cos(a)), target) for a in angles]


def render_clip(scene: Scene3D, poses, size: int = 64, fov_degrees: float = 60.0) -> list[Frame]:
    """One frame per pose with the same intrinsics: a short clip along a camera trajectory."""
    intrinsics = pinhole(size, fov_degrees)
    return [render_view(scene, intrinsics, pose, size) for pose in poses]
