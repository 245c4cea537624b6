"""Novel-view benchmark: textured scenes, train/test disjointness, the model's forward per camera encoding,
SE(3) invariance of the relative encodings (fp64), resumable training, PSNR/SSIM against known values."""

import json
import math

import numpy as np
import pytest
import torch

from mmpos.camera import axis_angle_to_matrix, pose_from_rotation_translation
from mmpos.eval.image_quality import gaussian_window, psnr, ssim
from mmpos.models.world.nvs import NVS_ENCODINGS, NovelViewTransformer
from mmpos.training.task_configs import NVSConfig
from mmpos.training.tasks.nvs import train_nvs
from mmpos.world.nvs_data import make_camera, make_triples, scene_seeds
from mmpos.world.scene3d import GROUND_ID, LIGHT, Scene3D, orbit_trajectory, render_view, sample_scene3d
from mmpos.world.textures import solid_texture


@pytest.fixture(scope="module")
def triples():
    return make_triples("train", 1, 2, size=16, objects=3)


def small_model(encoding, dtype=torch.float32):
    torch.manual_seed(0)
    model = NovelViewTransformer(encoding, image_size=16, patch=4, dim=48, depth=2, heads=2).to(dtype)
    with torch.no_grad():  # leave the zero-initialised parts (target token, depth heads) random
        for name, p in model.named_parameters():
            if "target_token" in name or "depth" in name:
                p.normal_(0, 0.5)
    return model


def test_textured_scene_keeps_geometry_and_is_seeded():
    flat, textured = sample_scene3d(4, 4), sample_scene3d(4, 4, textured=True)
    assert [(p.colour, getattr(p, "radius", None)) for p in flat.primitives] == [
        (p.colour, getattr(p, "radius", None)) for p in textured.primitives
    ]
    assert all(p.texture == "flat" for p in flat.primitives) and flat.ground_texture == "flat"
    assert textured == sample_scene3d(4, 4, textured=True)
    with pytest.raises(ValueError, match="texture"):
        Scene3D(ground_texture="plaid")


def test_ground_checker_is_fixed_in_the_world():
    scene = Scene3D((), ground_texture="checker")
    shade = 0.35 + 0.65 * max(float(np.array([0.0, -1.0, 0.0]) @ LIGHT), 0.0)
    for c2w in orbit_trajectory(2, degrees=50).c2w:
        frame = render_view(scene, make_camera("pinhole", 24), c2w)
        ground = frame.ids == GROUND_ID
        assert ground.sum() > 100
        values = {int(v) for v in frame.image[ground][:, 0]}
        assert values == {round(128 * shade), round(128 * shade * 0.55)}
    points = np.array([[0.1, 0.0, 0.1], [0.6, 0.0, 0.1]])  # neighbouring 0.5 cells differ
    assert solid_texture("checker", points, 0.5).tolist() == [1.0, 0.55]


def test_train_and_test_scenes_are_disjoint(triples):
    train, test = set(scene_seeds("train", 500)), set(scene_seeds("test", 500))
    assert not train & test
    other = make_triples("test", 1, 2, size=16, objects=3)
    assert not torch.equal(triples["images"], other["images"])
    assert torch.equal(triples["images"], make_triples("train", 1, 2, size=16, objects=3)["images"])
    with pytest.raises(ValueError, match="split"):
        scene_seeds("val", 3)


@pytest.mark.parametrize("encoding", NVS_ENCODINGS)
def test_forward_and_backward_with_each_encoding(encoding, triples):
    model = small_model(encoding)
    prediction = model(triples)
    assert prediction.shape == (2, 3, 16, 16) and ((prediction > 0) & (prediction < 1)).all()
    (prediction - triples["images"][:, 2]).pow(2).mean().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    if encoding == "rayrope":
        assert any(b.attn.depth.weight.grad.abs().sum() > 0 for b in model.blocks)


def rigid_motion(dtype=torch.float64):
    rotation = axis_angle_to_matrix(torch.tensor([0.3, -1.1, 0.7], dtype=dtype))
    return pose_from_rotation_translation(rotation, torch.tensor([2.0, -0.5, 3.0], dtype=dtype))


@pytest.mark.parametrize("encoding", ["prope", "ucpe", "rayrope", "plucker"])
def test_relative_encodings_are_invariant_to_moving_all_cameras(encoding, triples):
    model = small_model(encoding, torch.float64)
    batch = dict(triples, images=triples["images"].double())
    moved = dict(batch, c2w=rigid_motion() @ batch["c2w"])
    with torch.no_grad():
        difference = (model(batch) - model(moved)).abs().max().item()
    if encoding == "plucker":  # absolute rays: the prediction must depend on the world frame
        assert difference > 1e-4
    else:
        assert difference < 1e-12


def test_interrupted_training_resumes_to_the_same_weights(triples, tmp_path):
    recipe = NVSConfig("ucpe", seed=1, steps=4, batch_size=2, warmup=2, dim=48, depth=1)
    straight, _ = train_nvs(
        NVSConfig(**dict(vars(recipe), checkpoint_every=4)), triples, str(tmp_path / "a.pt"), log=lambda _: None
    )
    train_nvs(NVSConfig(**dict(vars(recipe), steps=2)), triples, str(tmp_path / "b.pt"), log=lambda _: None)
    stopped = tmp_path / "b" / "checkpoint-2"  # a run stopped after 2 of 4 steps
    for name in ("nvs_progress.json", "config.yaml"):
        text = (stopped / name).read_text().replace('"steps": 2', '"steps": 4').replace("steps: 2", "steps: 4")
        (stopped / name).write_text(text)
    progress = json.loads((stopped / "progress.json").read_text())  # the sizes it records, as if written so
    progress["files"].update({n: (stopped / n).stat().st_size for n in ("nvs_progress.json", "config.yaml")})
    (stopped / "progress.json").write_text(json.dumps(progress))
    resumed, state = train_nvs(recipe, triples, str(tmp_path / "b.pt"), log=lambda _: None)
    assert state["step"] == 4 and len(state["losses"]) == 4
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="--resume: lr is 0.5 but the run was started with 0.001"):
        train_nvs(NVSConfig(**dict(vars(recipe), lr=0.5)), triples, str(tmp_path / "b.pt"), log=lambda _: None)


def test_psnr_of_a_known_mse():
    target = torch.rand(2, 3, 16, 16, dtype=torch.float64) * 0.5
    assert psnr(target + 0.1, target).tolist() == pytest.approx([20.0, 20.0], abs=1e-12)  # MSE 0.01
    assert psnr(2 * (target + 0.1), 2 * target, data_range=2.0).tolist() == pytest.approx([20.0, 20.0], abs=1e-12)
    with pytest.raises(ValueError, match="prediction and target"):
        psnr(target, target[0])


def test_ssim_known_values():
    images = torch.rand(3, 3, 16, 16, dtype=torch.float64)
    assert ssim(images, images).tolist() == pytest.approx([1.0] * 3, abs=1e-12)
    a, b = torch.full((1, 1, 12, 12), 0.2, dtype=torch.float64), torch.full((1, 1, 12, 12), 0.6, dtype=torch.float64)
    c1 = 0.01**2  # constant images: zero variance, SSIM = luminance term only
    assert ssim(a, b).item() == pytest.approx((2 * 0.2 * 0.6 + c1) / (0.2**2 + 0.6**2 + c1), abs=1e-12)


def test_ssim_matches_a_direct_windowed_computation():
    torch.manual_seed(0)
    x, y = torch.rand(1, 1, 13, 13, dtype=torch.float64), torch.rand(1, 1, 13, 13, dtype=torch.float64)
    w = gaussian_window()
    values = []
    for i in range(3):
        for j in range(3):
            px, py = x[0, 0, i : i + 11, j : j + 11], y[0, 0, i : i + 11, j : j + 11]
            mx, my = (w * px).sum(), (w * py).sum()
            vx, vy = (w * (px - mx) ** 2).sum(), (w * (py - my) ** 2).sum()
            cov = (w * (px - mx) * (py - my)).sum()
            c1, c2 = 0.01**2, 0.03**2
            values.append((2 * mx * my + c1) * (2 * cov + c2) / ((mx**2 + my**2 + c1) * (vx + vy + c2)))
    assert ssim(x, y).item() == pytest.approx(torch.stack(values).mean().item(), abs=1e-12)
    assert math.isclose(gaussian_window().sum().item(), 1.0, abs_tol=1e-15)


def test_continued_training_starts_from_the_earlier_weights(triples, tmp_path):
    first = NVSConfig("prope", seed=2, steps=2, batch_size=2, warmup=1, dim=48, depth=1)
    earlier, state = train_nvs(first, triples, str(tmp_path / "first.pt"), log=lambda _: None)
    again = NVSConfig(**dict(vars(first), steps=1, lr=0.0, init_from=str(tmp_path / "first.pt")))
    continued, totals = train_nvs(again, triples, str(tmp_path / "second.pt"), log=lambda _: None)
    assert totals["previous_steps"] == 2 and totals["previous_cpu_seconds"] == state["cpu_seconds"]
    for (name, a), b in zip(earlier.state_dict().items(), continued.state_dict().values()):
        assert torch.equal(a, b), name  # lr 0: the continued run kept the weights it started from
    with pytest.raises(ValueError, match="finished ucpe checkpoint"):
        train_nvs(NVSConfig(**dict(vars(again), encoding="ucpe")), triples, str(tmp_path / "third.pt"))
