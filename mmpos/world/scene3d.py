"""Simple 3D scenes (spheres, boxes, a ground plane) ray-cast from known pinhole cameras, and clips along
camera trajectories: images with per-pixel depth and object ids as ground truth for camera work.

Cameras, poses and trajectories are :mod:`mmpos.camera`'s (OpenCV axes, camera-to-world poses, pixel centres
at ``(u + 0.5, v + 0.5)``, world y pointing down): any camera model renders (fisheye included), and any
:class:`~mmpos.camera.Trajectory` (presets, RealEstate10K or JSON files) gives a clip. Intersection and shading
run in float64 numpy (small images; exactness over speed).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from .._validation import check_positive_int
from ..camera.poses import check_pose, invert_pose, look_at
from ..camera.presets import base_intrinsics
from ..camera.rays import ray_grid, world_rays
from ..camera.trajectory import Trajectory
from .scene import COLOURS
from .textures import TEXTURES, check_texture, sky_texture, solid_texture

LIGHT = np.array([0.4, -1.0, -0.3]) / np.linalg.norm([0.4, -1.0, -0.3])  # towards the light (up is -y)
GROUND_ID, SKY_ID, INVALID_ID = -1, -2, -3


@dataclass(frozen=True)
class Sphere:
    centre: tuple[float, float, float]
    radius: float
    colour: str
    texture: str = "flat"  # one of mmpos.world.textures.TEXTURES, in world coordinates


@dataclass(frozen=True)
class Box:
    """Axis-aligned box from ``low`` to ``high`` corners."""

    low: tuple[float, float, float]
    high: tuple[float, float, float]
    colour: str
    texture: str = "flat"


@dataclass(frozen=True)
class Scene3D:
    """Primitives standing on the ground plane ``y = ground_y`` (y points down, so objects have y < 0)."""

    primitives: tuple = field(default_factory=tuple)
    ground_y: float = 0.0
    ground_colour: str = "gray"
    sky_colour: str = "cyan"
    ground_texture: str = "flat"  # textures of mmpos.world.textures (checker cells of 0.5 on the ground)
    sky_texture: str = "flat"  # "stripes": bands in azimuth, so that camera rotation is visible

    def __post_init__(self):
        for texture in (self.ground_texture, self.sky_texture, *(p.texture for p in self.primitives)):
            check_texture(texture)


@dataclass
class Frame:
    image: np.ndarray  # uint8 [H, W, 3]
    depth: np.ndarray  # float64 [H, W], z in camera coordinates (inf for sky)
    ids: np.ndarray  # int [H, W]: primitive index, GROUND_ID, SKY_ID or INVALID_ID (no ray)
    intrinsics: np.ndarray | None  # [3, 3] K of cameras that have one (pinhole, OpenCV, fisheye), else None
    pose: np.ndarray  # camera-to-world [4, 4]


def orbit_trajectory(
    frames: int,
    radius: float = 3.5,
    height: float = 1.8,
    degrees: float = 90.0,
    target=(0.0, -0.4, 0.0),
    fov_degrees: float = 60.0,
) -> Trajectory:
    """A :class:`~mmpos.camera.Trajectory` on a horizontal arc of ``degrees`` around ``target`` at ``height``
    above the ground, looking at it (square images, horizontal field of view ``fov_degrees``)."""
    check_positive_int("frames", frames)
    if not 0.0 < fov_degrees < 180.0:
        raise ValueError(f"fov_degrees must be in (0, 180), got {fov_degrees}")
    angles = torch.deg2rad(torch.linspace(0.0, degrees, frames, dtype=torch.float64))
    eye = torch.stack([radius * angles.sin(), torch.full_like(angles, -height), -radius * angles.cos()], -1)
    c2w = look_at(eye, torch.tensor(target, dtype=torch.float64).expand_as(eye))
    return Trajectory(c2w, base_intrinsics(frames, fov_degrees, aspect=1.0))


def camera_rays(camera, c2w: torch.Tensor):
    """World rays through the pixel centres of ``camera`` (any :mod:`mmpos.camera` model) at pose ``c2w``:
    ``(origin [3], directions [H, W, 3], valid [H, W])`` float64 numpy."""
    height, width = int(round(camera.height)), int(round(camera.width))
    rays, valid = ray_grid(camera, (height, width), dtype=torch.float64)
    origins, directions = world_rays(c2w.to(torch.float64), rays)
    return (origins[0].numpy(), directions.reshape(height, width, 3).numpy(), valid.reshape(height, width).numpy())


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


def render_view(scene: Scene3D, camera, c2w) -> Frame:
    """Ray-cast ``scene`` from ``camera`` (a :mod:`mmpos.camera` model; its width x height pixels) at pose
    ``c2w [4, 4]``: nearest hit per pixel, Lambert shading with ambient light. Pixels the camera model has
    no ray for (outside a fisheye's circle) are black with id ``INVALID_ID``."""
    c2w = check_pose("c2w", torch.as_tensor(c2w, dtype=torch.float64))
    origin, directions, valid = camera_rays(camera, c2w)
    best = np.full(directions.shape[:2], np.inf)
    ids = np.full(directions.shape[:2], SKY_ID)
    normals = np.zeros(directions.shape)
    albedo = np.broadcast_to(np.array(COLOURS[scene.sky_colour], dtype=np.float64), directions.shape).copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        t_ground = (scene.ground_y - origin[1]) / directions[..., 1]
    candidates = [
        (
            GROUND_ID,
            np.where(t_ground > 1e-9, t_ground, np.inf),
            np.broadcast_to([0.0, -1.0, 0.0], directions.shape),
            scene.ground_colour,
        )
    ]
    for index, primitive in enumerate(scene.primitives):
        hit = _hit_sphere if isinstance(primitive, Sphere) else _hit_box
        candidates.append((index, *hit(origin, directions, primitive), primitive.colour))
    for index, t, normal, colour in candidates:
        closer = (t < best) & valid
        best[closer], ids[closer] = t[closer], index
        normals[closer] = normal[closer]
        albedo[closer] = COLOURS[colour]
    shade = np.where(ids == SKY_ID, 1.0, 0.35 + 0.65 * np.clip(normals @ LIGHT, 0.0, 1.0)) * valid
    shade = shade * _texture_factors(scene, origin, directions, best, ids)
    image = np.rint(np.clip(albedo * shade[..., None], 0, 255)).astype(np.uint8)
    pose = c2w.numpy()
    depth = np.where(np.isfinite(best), best * (directions @ pose[:3, 2]), np.inf)
    ids[~valid] = INVALID_ID
    intrinsics = camera.intrinsic_matrix(torch.float64).numpy() if hasattr(camera, "intrinsic_matrix") else None
    return Frame(image, depth, ids, intrinsics, pose)


def _texture_factors(scene: Scene3D, origin, directions, distance, ids) -> np.ndarray:
    """``[H, W]`` brightness of each pixel's surface texture at its hit point (sky: of its direction)."""
    factors = np.ones(ids.shape)
    points = origin + directions * np.where(np.isfinite(distance), distance, 0.0)[..., None]
    sky = ids == SKY_ID
    factors[sky] = sky_texture(scene.sky_texture, directions[sky])
    ground = ids == GROUND_ID
    factors[ground] = solid_texture(scene.ground_texture, points[ground], scale=0.5)
    for index, primitive in enumerate(scene.primitives):
        on = ids == index
        factors[on] = solid_texture(primitive.texture, points[on])
    return factors


def sample_scene3d(seed: int, count: int = 3, textured: bool = False) -> Scene3D:
    """Random spheres and boxes on the ground around the origin, deterministic per seed.

    ``textured``: the same geometry and colours, plus a checker ground, striped sky and a random texture per
    object (checker, stripes or noise; drawn from a second stream of the seed, so the flat scene is unchanged)."""
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
            low, high = (float(x) - size, -2 * size, float(z) - size), (float(x) + size, 0.0, float(z) + size)
            primitives.append(Box(low, high, colour))
    if not textured:
        return Scene3D(tuple(primitives))
    texture_rng = np.random.default_rng([seed, 1])
    kinds = [str(texture_rng.choice(TEXTURES[1:])) for _ in primitives]
    primitives = [replace(p, texture=kind) for p, kind in zip(primitives, kinds)]
    return Scene3D(tuple(primitives), ground_texture="checker", sky_texture="stripes")


def place_trajectory(trajectory: Trajectory, start=None, scale: float = 1.0) -> Trajectory:
    """``trajectory`` moved so that its first camera is ``start`` (default: the first camera of
    :func:`orbit_trajectory`, above the ground looking at the scene), its motion relative to that camera kept and
    its translations multiplied by ``scale``. Presets start at the world origin and RealEstate10K files in their
    own frame and units; placed, they film the scene."""
    if not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    c2w = trajectory.c2w.to(torch.float64)
    start = orbit_trajectory(1).c2w[0] if start is None else check_pose("start", torch.as_tensor(start))
    relative = invert_pose(c2w[:1]) @ c2w
    relative[:, :3, 3] *= scale
    return Trajectory(start.to(torch.float64) @ relative, trajectory.intrinsics, trajectory.timestamps, trajectory.url)


def render_trajectory(scene: Scene3D, trajectory: Trajectory, size: int = 64) -> list[Frame]:
    """One ``size x size`` frame per pose of ``trajectory`` (its pinhole intrinsics per frame): a short clip."""
    check_positive_int("size", size)
    return [render_view(scene, trajectory.camera(i, size, size), trajectory.c2w[i]) for i in range(len(trajectory))]
