"""3D mini-world: ray-cast depth and ids agree with the pinhole camera model and the primitives (fp64)."""

import numpy as np
import pytest
import torch

from mmpos.camera import KannalaBrandt, Pinhole, look_at, preset_trajectory
from mmpos.world.scene3d import (
    GROUND_ID,
    INVALID_ID,
    SKY_ID,
    Box,
    Scene3D,
    Sphere,
    camera_rays,
    orbit_trajectory,
    place_trajectory,
    render_trajectory,
    render_view,
    sample_scene3d,
)


def pinhole(size, fov_degrees=60.0):
    focal = size / 2 / np.tan(np.radians(fov_degrees) / 2)
    return Pinhole(focal, focal, size / 2, size / 2, size, size)


def pose(eye, target):
    return look_at(torch.tensor(eye, dtype=torch.float64), torch.tensor(target, dtype=torch.float64))


def test_depth_on_the_optical_axis_is_exact():
    scene = Scene3D((Sphere((0.0, -1.0, 5.0), 1.0, "red"),), ground_y=10.0)
    frame = render_view(scene, pinhole(33), pose((0.0, -1.0, 0.0), (0.0, -1.0, 1.0)))
    assert frame.ids[16, 16] == 0 and frame.depth[16, 16] == pytest.approx(4.0, abs=1e-12)
    assert frame.ids[0, 0] == SKY_ID and np.isinf(frame.depth[0, 0])


def test_hits_reproject_to_their_pixels_and_lie_on_the_primitives():
    scene = sample_scene3d(3, count=4)
    size = 32
    trajectory = orbit_trajectory(3)
    for frame, c2w in zip(render_trajectory(scene, trajectory, size), trajectory.c2w):
        pose = c2w.numpy()
        origin, directions, valid = camera_rays(trajectory.camera(0, size, size), c2w)
        assert valid.all()
        hit = np.isfinite(frame.depth)
        distance = frame.depth / (directions @ pose[:3, 2])
        points = origin + directions * np.where(hit, distance, 0.0)[..., None]
        camera = (points - pose[:3, 3]) @ pose[:3, :3]
        pixels = camera @ frame.intrinsics.T
        uv = pixels[hit][:, :2] / pixels[hit][:, 2:]
        v, u = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5, indexing="ij")
        assert np.allclose(uv, np.stack([u, v], -1)[hit], atol=1e-9)
        assert np.allclose(camera[..., 2][hit], frame.depth[hit])
        for index, primitive in enumerate(scene.primitives):
            on = frame.ids == index
            if isinstance(primitive, Sphere):
                radii = np.linalg.norm(points[on] - np.asarray(primitive.centre), axis=-1)
                assert np.allclose(radii, primitive.radius, atol=1e-9)
            else:
                assert (points[on] >= np.asarray(primitive.low) - 1e-9).all()
                assert (points[on] <= np.asarray(primitive.high) + 1e-9).all()
        assert np.allclose(points[frame.ids == GROUND_ID][:, 1], 0.0, atol=1e-9)


def test_clips_are_deterministic_and_move():
    scene = sample_scene3d(5)
    a, b = (render_trajectory(s, orbit_trajectory(3), 24) for s in (scene, sample_scene3d(5)))
    assert all(np.array_equal(x.image, y.image) for x, y in zip(a, b))
    assert not np.array_equal(a[0].image, a[-1].image)
    assert {type(p) for p in sample_scene3d(3, count=4).primitives} == {Box, Sphere}  # both kinds tested above


def test_any_camera_model_and_preset_trajectory_render():
    scene = sample_scene3d(2)
    fisheye = KannalaBrandt(10.0, 10.0, 16.0, 16.0, 32, 32)  # equidistant, 180 deg: image circle r = 15.7 px
    frame = render_view(scene, fisheye, pose((0.0, -1.0, -4.0), (0.0, -0.5, 0.0)))
    corner, centre = frame.ids[0, 0], frame.ids[16, 16]
    assert corner == INVALID_ID and frame.image[0, 0].sum() == 0 and centre != INVALID_ID
    assert frame.intrinsics is not None
    for preset in ("arc", "pan", "dolly_in"):  # mmpos.camera presets drive clips once placed on the scene
        for seed in range(4):
            clip = render_trajectory(sample_scene3d(seed), place_trajectory(preset_trajectory(preset, 3)), 24)
            ids = np.stack([f.ids for f in clip])
            assert (ids == GROUND_ID).any() and (ids >= 0).any(), f"{preset}, seed {seed}: no ground or object"
            assert not np.array_equal(clip[0].image, clip[-1].image)


def test_placed_trajectory_keeps_relative_motion():
    trajectory = preset_trajectory("orbit", 4)
    placed = place_trajectory(trajectory, scale=2.0)
    start = orbit_trajectory(1).c2w[0]
    torch.testing.assert_close(placed.c2w[0], start, rtol=0, atol=1e-12)
    relative = torch.linalg.inv(trajectory.c2w[0]) @ trajectory.c2w
    moved = torch.linalg.inv(placed.c2w[0]) @ placed.c2w
    torch.testing.assert_close(moved[:, :3, :3], relative[:, :3, :3], rtol=0, atol=1e-12)
    torch.testing.assert_close(moved[:, :3, 3], 2.0 * relative[:, :3, 3], rtol=0, atol=1e-12)


def test_bad_cameras_are_clear_errors():
    with pytest.raises(ValueError, match="fov_degrees"):
        orbit_trajectory(3, fov_degrees=180.0)
    with pytest.raises(ValueError, match="parallel to `down`"):
        pose((0.0, 0.0, 0.0), (0.0, 5.0, 0.0))
    with pytest.raises(ValueError, match="frames"):
        orbit_trajectory(0)
    with pytest.raises(ValueError, match="c2w"):
        render_view(sample_scene3d(0), pinhole(8), torch.full((4, 4), float("nan")))
    with pytest.raises(ValueError, match="scale must be a positive number"):
        place_trajectory(orbit_trajectory(2), scale=0.0)
