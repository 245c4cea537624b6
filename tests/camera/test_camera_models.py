"""Camera models in fp64: round trips, reductions, unit rays, masks, resize/crop, and OpenCV as the peer."""

import math

import cv2
import numpy as np
import pytest
import torch

from mmpos.camera import Equirectangular, KannalaBrandt, OpenCVCamera, Pinhole, UnifiedCamera, patch_pixels, ray_grid

F64 = torch.float64
W, H = 128.0, 96.0

MODELS = {
    "pinhole": Pinhole(100, 110, 64, 48, W, H),
    "opencv": OpenCVCamera(100, 110, 62, 50, W, H, k1=-0.12, k2=0.02, p1=0.001, p2=-0.002, k3=-0.001),
    "kannala_brandt": KannalaBrandt(45, 46, 64, 48, W, H, k1=0.02, k2=-0.003, k3=0.001, k4=-0.0002),
    "unified_fisheye": UnifiedCamera.from_fov(W, H, 200, xi=2.3),
    "unified_wide": UnifiedCamera(60, 60, 64, 48, W, H, xi=0.8),
    "equirectangular": Equirectangular(W, H),
}


def _pixels(camera):
    return patch_pixels((24, 32), (camera.height, camera.width), dtype=F64)


@pytest.mark.parametrize("name", MODELS)
def test_project_unproject_round_trip_and_unit_rays(name):
    camera = MODELS[name]
    pixels = _pixels(camera)
    rays, valid = camera.unproject(pixels)
    assert valid.any() and torch.isfinite(rays).all()
    assert torch.allclose(rays.norm(dim=-1), torch.ones(len(rays), dtype=F64), atol=1e-14)
    back, back_valid = camera.project(rays * 3.7)  # any point on the ray projects to the pixel
    assert back_valid[valid].all()
    assert (back - pixels)[valid].abs().max() < 1e-9


@pytest.mark.parametrize("name", [n for n in MODELS if n != "equirectangular"])
def test_unproject_project_round_trip_on_rays(name):
    camera = MODELS[name]
    directions = torch.nn.functional.normalize(
        torch.randn(500, 3, dtype=F64) * torch.tensor([0.4, 0.3, 1.0], dtype=F64)
        + torch.tensor([0, 0, 1.0], dtype=F64),
        dim=-1,
    )
    pixels, valid = camera.project(directions)
    rays, ok = camera.unproject(pixels)
    both = valid & ok
    assert both.float().mean() > 0.5
    assert (rays - directions)[both].abs().max() < 1e-9


def test_unified_xi_zero_is_pinhole_and_fov_formula():
    unified = UnifiedCamera.from_fov(W, H, 90.0, xi=0.0)
    pinhole = Pinhole(W / 2 / math.tan(math.radians(45)), W / 2 / math.tan(math.radians(45)), W / 2, H / 2, W, H)
    assert unified.fx == pytest.approx(pinhole.fx, rel=1e-15)
    pixels = _pixels(unified)
    rays_u, _ = unified.unproject(pixels)
    rays_p, _ = pinhole.unproject(pixels)
    assert torch.allclose(rays_u, rays_p, atol=1e-15, rtol=0)
    points = torch.randn(100, 3, dtype=F64) + torch.tensor([0, 0, 4.0], dtype=F64)
    assert torch.allclose(unified.project(points)[0], pinhole.project(points)[0], atol=1e-12, rtol=0)


def test_fisheye_invalid_pixels_are_masked_and_finite():
    camera = UnifiedCamera.from_fov(W, H, 200, xi=2.3)
    corners = torch.tensor([[0.0, 0.0], [W, H], [W / 2, H / 2]], dtype=F64)
    rays, valid = camera.unproject(corners)
    assert valid.tolist() == [False, False, True] and torch.isfinite(rays).all()
    kb = MODELS["kannala_brandt"]
    far = torch.tensor([[W / 2 + 1e4, H / 2]], dtype=F64)
    rays, valid = kb.unproject(far)
    assert not valid.any() and torch.isfinite(rays).all()


@pytest.mark.parametrize("name", ["pinhole", "opencv", "unified_wide"])
def test_points_behind_the_camera_are_masked_and_finite(name):
    camera = MODELS[name]
    behind = torch.tensor([[0.1, 0.2, -1.0], [0.0, 0.0, -5.0], [0.0, 0.0, 0.0]], dtype=F64)
    pixels, valid = camera.project(behind)
    assert not valid.any() and torch.isfinite(pixels).all()


def test_unified_beyond_180_degrees_sees_behind():
    camera = MODELS["unified_fisheye"]
    pixels, valid = camera.project(torch.tensor([[1.0, 0.0, -0.2]], dtype=F64))
    assert valid.all() and torch.isfinite(pixels).all()


def test_opencv_distortion_matches_cv2():
    camera = MODELS["opencv"]
    points = np.random.default_rng(0).normal(size=(50, 3)) * [0.3, 0.3, 0.1] + [0, 0, 1]
    k = camera.intrinsic_matrix(F64).numpy()
    dist = np.array([camera.k1, camera.k2, camera.p1, camera.p2, camera.k3])
    expected, _ = cv2.projectPoints(points, np.zeros(3), np.zeros(3), k, dist)
    ours, _ = camera.project(torch.tensor(points))
    assert np.abs(ours.numpy() - expected[:, 0]).max() < 1e-9
    undistorted = cv2.undistortPoints(
        expected, k, dist, criteria=(cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 100, 1e-14)
    )[:, 0]
    rays, valid = camera.unproject(torch.tensor(expected[:, 0]))
    assert valid.all()
    assert np.abs((rays[:, :2] / rays[:, 2:]).numpy() - undistorted).max() < 1e-8


def test_kannala_brandt_matches_cv2_fisheye():
    camera = MODELS["kannala_brandt"]
    points = np.random.default_rng(1).normal(size=(50, 1, 3)) * [0.8, 0.8, 0.3] + [0, 0, 1]
    k = camera.intrinsic_matrix(F64).numpy()
    dist = np.array([camera.k1, camera.k2, camera.k3, camera.k4])
    expected, _ = cv2.fisheye.projectPoints(points, np.zeros(3), np.zeros(3), k, dist)
    ours, valid = camera.project(torch.tensor(points[:, 0]))
    assert valid.all() and np.abs(ours.numpy() - expected[:, 0]).max() < 1e-9


def test_resize_and_crop_keep_rays():
    camera = MODELS["opencv"]
    pixels = _pixels(camera)
    rays, _ = camera.unproject(pixels)
    half = camera.resized(W / 2, H / 4)
    rays_half, _ = half.unproject(pixels * torch.tensor([0.5, 0.25], dtype=F64))
    assert torch.allclose(rays, rays_half, atol=1e-12, rtol=0)
    crop = camera.cropped(10, 20, 64, 48)
    inside = (pixels[:, 0] > 10) & (pixels[:, 0] < 74) & (pixels[:, 1] > 20) & (pixels[:, 1] < 68)
    rays_crop, _ = crop.unproject(pixels[inside] - torch.tensor([10.0, 20.0], dtype=F64))
    assert torch.allclose(rays[inside], rays_crop, atol=1e-12, rtol=0)


def test_ray_grid_patch_centre_convention():
    camera = Pinhole(50, 50, 32, 16, 64, 32)
    rays, valid = ray_grid(camera, (2, 4), dtype=F64)
    pixels = patch_pixels((2, 4), (32, 64), dtype=F64)
    assert pixels[0].tolist() == [8.0, 8.0] and pixels[-1].tolist() == [56.0, 24.0]
    # symmetric grid around the principal point: rays mirror left/right and top/bottom
    grid = rays.reshape(2, 4, 3)
    assert torch.allclose(grid[:, :, 0], -grid.flip(1)[:, :, 0], atol=1e-15)
    assert torch.allclose(grid[:, :, 1], -grid.flip(0)[:, :, 1], atol=1e-15)
    corner = patch_pixels((2, 4), (32, 64), offset=(0, 0), dtype=F64)
    assert corner[5].tolist() == [16.0, 16.0]


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: Pinhole(-100, 100, 64, 48, W, H), "fx must be positive"),
        (lambda: Pinhole(float("nan"), 100, 64, 48, W, H), "fx must be a finite number"),
        (lambda: Pinhole(100, float("inf"), 64, 48, W, H), "fy must be a finite number"),
        (lambda: UnifiedCamera(100, 100, 64, 48, W, H, xi=-0.5), "xi must be >= 0"),
        (lambda: OpenCVCamera(30, 30, 64, 48, W, H, k1=-0.5), "outside the valid range"),
        (lambda: KannalaBrandt(40, 40, 64, 48, W, H, k1=-0.5), "outside the valid range"),
        (lambda: KannalaBrandt(40, 40, 64, 48, W, H, max_angle=3.2), "max_angle must be below pi"),
        (lambda: UnifiedCamera.from_fov(W, H, 200, xi=0.1), "not reachable"),
        (lambda: MODELS["pinhole"].cropped(100, 0, 64, 48), "outside"),
        (lambda: MODELS["equirectangular"].cropped(0, 0, 10, 10), "360 x 180"),
    ],
)
def test_invalid_parameters_raise_clear_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_16_bit_pixels_are_refused():
    with pytest.raises(TypeError, match="float32 or float64"):
        MODELS["pinhole"].unproject(torch.zeros(3, 2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"\[..., 3\]"):
        MODELS["pinhole"].project(torch.zeros(3, 2, dtype=F64))
