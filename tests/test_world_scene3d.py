"""3D mini-world: ray-cast depth and ids agree with the pinhole camera model and the primitives (fp64)."""
import numpy as np
import pytest

from mmpos.world.scene3d import (GROUND_ID, SKY_ID, Box, Scene3D, Sphere, camera_rays, look_at, orbit_poses,
                                 pinhole, render_clip, render_view, sample_scene3d)


def test_depth_on_the_optical_axis_is_exact():
    scene = Scene3D((Sphere((0.0, -1.0, 5.0), 1.0, "red"),), ground_y=10.0)
    frame = render_view(scene, pinhole(33), look_at((0.0, -1.0, 0.0), (0.0, -1.0, 1.0)), 33)
    assert frame.ids[16, 16] == 0 and frame.depth[16, 16] == pytest.approx(4.0, abs=1e-12)
    assert frame.ids[0, 0] == SKY_ID and np.isinf(frame.depth[0, 0])


def test_hits_reproject_to_their_pixels_and_lie_on_the_primitives():
    scene = sample_scene3d(3, count=4)
    size = 32
    for pose in orbit_poses(3):
        frame = render_view(scene, pinhole(size), pose, size)
        origin, directions = camera_rays(frame.intrinsics, pose, size)
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
    a, b = render_clip(scene, orbit_poses(3), 24), render_clip(sample_scene3d(5), orbit_poses(3), 24)
    assert all(np.array_equal(x.image, y.image) for x, y in zip(a, b))
    assert not np.array_equal(a[0].image, a[-1].image)
    assert {type(p) for p in sample_scene3d(3, count=4).primitives} == {Box, Sphere}  # both kinds tested above


def test_bad_cameras_are_clear_errors():
    with pytest.raises(ValueError, match="fov_degrees"):
        pinhole(32, 180.0)
    with pytest.raises(ValueError, match="parallel to up"):
        look_at((0.0, 0.0, 0.0), (0.0, 5.0, 0.0))
    with pytest.raises(ValueError, match="frames"):
        orbit_poses(0)
