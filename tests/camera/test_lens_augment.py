"""Camera-model augmentation: a pinhole frame re-rendered by another camera model (OpenCV radial, unified)
agrees with that model's rays, the fitted camera sees only what the frame imaged, and a training sample hands
the adapter the same model's rays."""

import math

import numpy as np
import pytest
import torch
from PIL import Image

from mmpos.camera import OpenCVCamera, Pinhole, Trajectory, UnifiedCamera, write_json
from mmpos.camera.lens_augment import LensAugmentation, lens_camera, pixel_centres, sees_inside, warp_to_camera
from mmpos.camera.video import CameraPath, video_cameras
from mmpos.training.camera_clips import load_sample, read_clip

WIDTH, HEIGHT = 96, 64
SOURCE = Pinhole(60.0, 60.0, 48.0, 32.0, WIDTH, HEIGHT)  # about 77 x 56 degrees


def world_colour(rays: torch.Tensor) -> torch.Tensor:
    """A smooth colour per viewing direction ``[..., 3]`` -> ``[..., 3]`` in [0, 255]: what any camera at this
    pose sees in that direction."""
    x, y, z = rays.unbind(-1)
    azimuth, elevation = torch.atan2(x, z), torch.asin(y.clamp(-1, 1))
    return 127.5 + 120 * torch.stack(
        [torch.sin(4 * azimuth), torch.cos(5 * elevation), torch.sin(3 * azimuth + 2 * elevation)], -1
    )


def render(camera) -> np.ndarray:
    rays, valid = camera.unproject(pixel_centres(int(camera.width), int(camera.height)))
    assert bool(valid.all())
    return world_colour(rays).numpy().astype(np.float32)


@pytest.mark.parametrize(
    "lens",
    [
        dict(model="opencv", zoom=1.0, k1=-0.2, k2=0.03),
        dict(model="opencv", zoom=1.2, k1=0.15, k2=-0.04),
        dict(model="unified", zoom=1.0, xi=0.8),
        dict(model="pinhole", zoom=1.3),
    ],
)
def test_the_warped_frame_is_what_the_new_camera_sees(lens):
    target = lens_camera(SOURCE, lens)
    assert sees_inside(target, SOURCE) and target.fx >= SOURCE.fx * lens["zoom"]
    warped = warp_to_camera(render(SOURCE), SOURCE, target)
    direct = render(target)  # the same world through the new model's own rays
    error = np.abs(warped - direct)
    assert error.mean() < 0.1 and error.max() < 0.5  # bilinear resampling of a smooth image (of 255)
    pinhole = render(Pinhole(target.fx, target.fy, target.cx, target.cy, WIDTH, HEIGHT))
    if lens["model"] != "pinhole":  # the undistorted camera of the same focal sees something else
        assert np.abs(pinhole - direct).mean() > 10 * error.mean()


def test_the_fit_grows_the_zoom_only_as_needed():
    barrel = lens_camera(SOURCE, dict(model="opencv", zoom=1.0, k1=-0.2, k2=0.0))
    assert barrel.fx > SOURCE.fx  # barrel distortion sees wider than the frame at zoom 1
    shrunk = OpenCVCamera(barrel.fx / 1.03, barrel.fy / 1.03, 48.0, 32.0, WIDTH, HEIGHT, k1=-0.2)
    assert not sees_inside(shrunk, SOURCE)  # one step less would not fit
    pincushion = lens_camera(SOURCE, dict(model="opencv", zoom=1.0, k1=0.2, k2=0.0))
    assert pincushion.fx == SOURCE.fx
    fisheye = lens_camera(SOURCE, dict(model="unified", zoom=1.0, xi=0.9))
    assert isinstance(fisheye, UnifiedCamera) and fisheye.fx > SOURCE.fx


def test_sampling_and_errors():
    augmentation = LensAugmentation(("pinhole", "opencv", "unified"), max_zoom=1.5)
    generator = torch.Generator().manual_seed(0)
    lenses = [augmentation.sample(generator) for _ in range(60)]
    assert {lens["model"] for lens in lenses} == {"pinhole", "opencv", "unified"}
    assert all(1 <= lens["zoom"] <= 1.5 for lens in lenses)
    assert all(-0.2 <= lens["k1"] <= 0.2 and -0.05 <= lens["k2"] <= 0.05 for lens in lenses if "k1" in lens)
    with pytest.raises(ValueError, match="expected one or more of"):
        LensAugmentation(("fisheye",))
    with pytest.raises(ValueError, match="max_zoom must be >= 1"):
        LensAugmentation(max_zoom=0.5)


def test_a_training_sample_hands_the_adapter_the_warped_frames_rays(tmp_path):
    """A clip rendered by the pinhole; the sample's frames are re-rendered by the drawn model, and the rays
    ``video_cameras`` gives the adapter (at patch centres) see the colour the warped frame has there."""
    frames = 3
    clip = tmp_path / "clip"
    clip.mkdir()
    picture = render(SOURCE)
    for i in range(frames):
        Image.fromarray(picture.round().clip(0, 255).astype(np.uint8)).save(clip / f"frame_{i:03d}.png")
    normalised = torch.tensor([[60 / WIDTH, 60 / HEIGHT, 0.5, 0.5]], dtype=torch.float64).expand(frames, 4)
    write_json(
        Trajectory(torch.eye(4, dtype=torch.float64).expand(frames, 4, 4).clone(), normalised.clone()),
        clip / "trajectory.json",
    )
    lens = dict(model="unified", zoom=1.1, xi=0.7)
    video, camera, _ = load_sample(read_clip(clip), frames, (HEIGHT, WIDTH), lens=lens)
    assert isinstance(camera, CameraPath) and camera.models[0] == lens_camera(SOURCE, lens)
    cameras = video_cameras(camera, (frames, HEIGHT // 16, WIDTH // 16), (HEIGHT, WIDTH), dtype=torch.float64)
    warped = (video[:, 0].permute(1, 2, 0).double() + 1) * 127.5  # frame 0, [H, W, 3]
    # a patch centre (u, v) = (16 c + 8, 16 r + 8) is the corner of four pixels: their mean is the bilinear value
    at_patches = sum(warped[7 + dr :: 16, 7 + dc :: 16] for dr in (0, 1) for dc in (0, 1)).reshape(-1, 3) / 4
    seen = world_colour(cameras.rays[0, 0])  # [P, 3]: what the adapter's rays see
    error = (at_patches - seen).abs()
    assert error.mean() < 1.0 and error.max() < 6
    pinhole_rays, _ = SOURCE.unproject(pixel_centres(WIDTH, HEIGHT)[7::16, 7::16] + 0.5)
    assert (at_patches - world_colour(pinhole_rays.reshape(-1, 3))).abs().mean() > 10 * error.mean()
    assert math.isclose(float(cameras.rays[0, 0].norm(dim=-1).max()), 1.0, rel_tol=1e-12)
