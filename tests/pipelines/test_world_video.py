"""The world video model: clips, conditioning, pipeline, training resume, camera-following measurement."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mmpos.camera import camera_centers
from mmpos.eval.camera_following import camera_errors, clip_camera_errors, frame_motion, relative_motion, rotation_angle
from mmpos.models.world.video import flow_loss, token_timesteps, world_video_transformer
from mmpos.training.model_cards import card_metadata, split_front_matter
from mmpos.world.video_data import (
    MOTIONS,
    Motion,
    clip_trajectory,
    make_clips,
    motion_trajectory,
    render_clip,
    scene_seeds,
    start_pose,
)

SMALL = dict(num_attention_heads=2, attention_head_dim=12, ffn_dim=16, num_layers=1)


@pytest.fixture(scope="module")
def clips():
    return make_clips("test", 2, 2)


def test_motions_do_what_they_say():
    start = start_pose(30.0)
    orbit = motion_trajectory(Motion("orbit", 40.0), start)
    pan = motion_trajectory(Motion("pan", -20.0), start)
    dolly = motion_trajectory(Motion("dolly", 1.0), start)
    for trajectory in (orbit, pan, dolly):
        assert torch.allclose(trajectory.c2w[0], start.double(), atol=1e-12)
    assert math.isclose(rotation_angle(relative_motion(orbit, 8)[0]), 40.0, abs_tol=1e-6)
    assert math.isclose(rotation_angle(relative_motion(pan, 8)[0]), 20.0, abs_tol=1e-6)
    assert np.abs(relative_motion(pan, 8)[1]).max() < 1e-12  # a pan does not move the camera
    centres = camera_centers(dolly.c2w)
    forward = dolly.c2w[0, :3, 2]
    assert torch.allclose(centres[-1] - centres[0], forward, atol=1e-9)  # 1 unit along the optical axis


def test_motion_rejects_bad_values():
    with pytest.raises(ValueError, match="kind"):
        Motion("zoom", 1.0)
    with pytest.raises(ValueError, match="amount"):
        Motion("pan", float("nan"))


def test_clips_are_deterministic_and_splits_disjoint(clips):
    again = make_clips("test", 2, 2)
    assert torch.equal(clips["frames"], again["frames"]) and torch.equal(clips["c2w"], again["c2w"])
    train = make_clips("train", 2, 2)
    assert not torch.equal(train["frames"], clips["frames"])
    assert clips["frames"].shape == (4, 9, 3, 32, 32) and clips["frames"].dtype == torch.uint8
    assert set(clips["motion"].tolist()) <= set(range(len(MOTIONS)))


def test_first_frame_tokens_get_timestep_zero():
    steps = token_timesteps(torch.tensor([500.0, 250.0]), (2, 4, 3, 8, 8), (1, 2, 2))
    assert steps.shape == (2, 3 * 16)
    assert (steps[:, :16] == 0).all() and (steps[0, 16:] == 500).all() and (steps[1, 16:] == 250).all()


def test_loss_ignores_the_noise_of_the_first_frame():
    torch.manual_seed(0)
    model = world_video_transformer(**SMALL)
    latents, noise = torch.randn(2, 4, 3, 8, 8), torch.randn(2, 4, 3, 8, 8)
    sigmas = torch.tensor([0.3, 0.8])
    other = noise.clone()
    other[:, :, 0] = torch.randn(2, 4, 8, 8)
    assert flow_loss(model, latents, sigmas, noise) == flow_loss(model, latents, sigmas, other)
    moved = noise.clone()
    moved[:, :, 1] += 1
    assert flow_loss(model, latents, sigmas, noise) != flow_loss(model, latents, sigmas, moved)


def test_unknown_transformer_option_is_named():
    with pytest.raises(ValueError, match="num_layer"):
        world_video_transformer(num_layer=2)


@pytest.fixture(scope="module")
def pipe():
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler

    from mmpos.pipelines import WorldVideoPipeline

    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=(8, 8),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        norm_num_groups=4,
    ).eval()
    pipeline = WorldVideoPipeline(world_video_transformer(**SMALL).eval(), vae, FlowMatchEulerDiscreteScheduler())
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _clip(pipe, first, **options):
    return pipe(
        first,
        num_frames=5,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        **options,
    ).frames


def test_pipeline_keeps_the_first_frame_and_a_zero_adapter_changes_nothing(pipe, clips):
    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter

    first = clips["frames"][0, 0][None].float() / 255
    plain = _clip(pipe, first)
    assert plain.shape == (1, 5, 3, 32, 32)
    with torch.no_grad():  # frame 0 is the VAE's reconstruction of the input
        z = pipe.vae.encode(first * 2 - 1).latent_dist.mode()
        reconstruction = (pipe.vae.decode(z).sample.clamp(-1, 1) + 1) / 2
    assert torch.allclose(plain[0, 0], reconstruction[0], atol=1e-5)
    for kind in ("ucpe", "plucker"):
        pipe.camera_adapter = CameraAdapter.for_transformer(pipe.transformer, kind)  # zero-initialised
        assert torch.equal(_clip(pipe, first, camera=clip_trajectory(clips, 0)), plain)
        with torch.no_grad():
            for p in pipe.camera_adapter.parameters():
                p.normal_(0, 0.5)
        assert not torch.allclose(_clip(pipe, first, camera=clip_trajectory(clips, 0)), plain)
    pipe.camera_adapter = None


def test_pipeline_round_trips_through_save_pretrained(pipe, clips, tmp_path):
    from mmpos.pipelines import WorldVideoPipeline

    first = clips["frames"][1, 0][None].float() / 255
    pipe.save_pretrained(tmp_path / "model")
    loaded = WorldVideoPipeline.from_pretrained(tmp_path / "model")
    loaded.set_progress_bar_config(disable=True)
    for name in ("transformer", "vae"):
        saved, restored = getattr(pipe, name).state_dict(), getattr(loaded, name).state_dict()
        assert saved.keys() == restored.keys() and all(torch.equal(saved[k], restored[k]) for k in saved)
    # equal weights; diffusers rebuilds Wan's rotary buffers on load (float rounding of ~1e-7)
    assert torch.allclose(_clip(loaded, first), _clip(pipe, first), atol=1e-5)


def test_pipeline_names_bad_sizes(pipe, clips):
    first = clips["frames"][0, 0][None].float() / 255
    with pytest.raises(ValueError, match="height and width"):
        pipe(first, height=30, width=32)
    with pytest.raises(ValueError, match="camera adapter"):
        pipe(first, camera=clip_trajectory(clips, 0))


def test_opencv_recovers_the_rendered_motion_and_rejects_the_opposite(clips):
    """On ground-truth renders the recovered motion matches the commanded one (a few degrees at 32 px); against
    the mirrored command (the rotation the other way) the error is far larger: the measurement tells following
    from not following."""
    true_errors, mirrored_errors = [], []
    for index in range(len(clips["frames"])):
        frames = clips["frames"][index].permute(0, 2, 3, 1).numpy()
        trajectory = clip_trajectory(clips, index)
        kind = MOTIONS[int(clips["motion"][index])]
        errors = clip_camera_errors(frames, trajectory)
        assert errors["tracks"] >= 8
        true_errors.append(errors["rot_err"])
        if kind == "dolly":
            assert errors["trans_err"] < 30.0
        else:
            mirrored = motion_trajectory(Motion(kind, -float(clips["amount"][index])), trajectory.c2w[0])
            mirrored_errors.append(clip_camera_errors(frames, mirrored)["rot_err"])
    assert np.mean(true_errors) < 5.0 and max(true_errors) < 15.0
    assert mirrored_errors and min(mirrored_errors) > 10.0 + np.mean(true_errors)


def test_every_frame_of_a_rendered_pan_recovers_its_rotation():
    """A pan has no baseline: the essential matrix is degenerate (``recoverPose`` returned 180 degrees on some
    frames, and 8-15 on others); the rotation-only fit takes over, every frame within a few degrees."""
    from mmpos.world.scene3d import sample_scene3d

    worst = 0.0
    for seed in scene_seeds("test", 4):
        scene = sample_scene3d(seed, 4, textured=True)
        for amount, azimuth in ((20.0, 30.0), (-15.0, 200.0)):
            trajectory = motion_trajectory(Motion("pan", amount), start_pose(azimuth))
            errors = camera_errors(render_clip(scene, trajectory).permute(0, 2, 3, 1).numpy(), trajectory)
            assert errors["rotation_only"].all() and np.isnan(errors["trans_err"]).all()
            worst = max(worst, float(np.max(errors["rot_err"])))
    assert worst < 3.0


def _tracks(rotation, translation, seed=0, count=60, noise=0.0):
    """Normalised image tracks of random points 2-6 units in front of camera 0, seen from camera ``k``
    (``x_k = R x_0 + t``)."""
    rng = np.random.default_rng(seed)
    points = np.concatenate([rng.uniform(-1.5, 1.5, (count, 2)), np.zeros((count, 1))], 1)
    points[:, 2] = rng.uniform(2.0, 6.0, count)
    points[:, :2] *= points[:, 2:] / 3
    moved = points @ rotation.T + translation
    first, second = points[:, :2] / points[:, 2:], moved[:, :2] / moved[:, 2:]
    return first, second + rng.normal(0, noise, second.shape)


def test_frame_motion_picks_the_rotation_model_only_without_parallax():
    from mmpos.camera import axis_angle_to_matrix

    focal = 128.0  # pixels: 1 px = 1 / 128 normalised units
    axis = torch.tensor([0.1, 1.0, 0.05], dtype=torch.float64)
    rotation = axis_angle_to_matrix(axis / axis.norm() * math.radians(12.0)).numpy()
    assert math.isclose(rotation_angle(rotation), 12.0, abs_tol=1e-9)
    for noise in (0.0, 0.3 / focal):  # exact tracks, then 0.3 px of noise
        recovered, translation = frame_motion(*_tracks(rotation, np.zeros(3), noise=noise), focal)
        assert translation is None and rotation_angle(recovered.T @ rotation) < (1e-6 if noise == 0 else 0.3)
    step = np.array([0.4, 0.05, 0.1])  # a real baseline: the essential matrix and its translation direction
    recovered, translation = frame_motion(*_tracks(rotation, step, count=200, noise=0.2 / focal), focal)
    assert translation is not None and rotation_angle(recovered.T @ rotation) < 1.0
    cosine = translation @ step / (np.linalg.norm(translation) * np.linalg.norm(step))
    assert math.degrees(math.acos(min(1.0, cosine))) < 5.0


def test_training_resumes_bit_identically(clips, tmp_path):
    from diffusers import AutoencoderKL

    from mmpos.models.world import video as video_model
    from mmpos.training.task_configs import WorldVideoConfig
    from mmpos.training.tasks.world_video import train_stage

    vae = AutoencoderKL(
        block_out_channels=(8, 8),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        norm_num_groups=4,
    )
    original = dict(video_model.TRANSFORMER_CONFIG)
    video_model.TRANSFORMER_CONFIG.update(SMALL)
    try:
        recipe = WorldVideoConfig("base", steps=3, batch_size=2, checkpoint_every=1, warmup=1)
        whole = train_stage(recipe, clips, tmp_path / "whole", vae, log=lambda _: None)
        stopped = train_stage(recipe, clips, tmp_path / "split", vae, stop_at=1, log=lambda _: None)
        assert stopped["step"] == 1 and not stopped["finished"]
        assert not (tmp_path / "split" / "transformer").exists()
        resumed = train_stage(recipe, clips, tmp_path / "split", vae, log=lambda _: None)
    finally:
        video_model.TRANSFORMER_CONFIG.clear()
        video_model.TRANSFORMER_CONFIG.update(original)
    assert whole["losses"] == resumed["losses"] and whole["finished"] and resumed["finished"]
    assert (tmp_path / "whole" / "transformer" / "config.json").is_file()
    with pytest.raises(ValueError, match="init_from must be a finished"):
        train_stage(
            WorldVideoConfig("base", steps=1, batch_size=2, init_from=str(tmp_path / "nothing")),
            clips,
            tmp_path / "bad",
            vae,
            log=lambda _: None,
        )


def test_export_writes_a_loadable_model_folder_and_the_demo_section(clips, tmp_path, monkeypatch):
    from diffusers import AutoencoderKL

    from mmpos.models.world import video as video_model
    from mmpos.pipelines.world import video_demo
    from mmpos.pipelines.world.video_export import export_world_video
    from mmpos.training.task_configs import WorldVideoConfig
    from mmpos.training.tasks.world_video import train_stage

    monkeypatch.setattr(video_model, "TRANSFORMER_CONFIG", {**video_model.TRANSFORMER_CONFIG, **SMALL})
    runs = tmp_path / "runs"
    vae = AutoencoderKL(
        block_out_channels=(8, 8),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        norm_num_groups=4,
    )
    quiet = dict(log=lambda _: None)
    train_stage(WorldVideoConfig("vae", steps=1, batch_size=2), clips, runs / "vae", vae, **quiet)
    train_stage(WorldVideoConfig("base", steps=1, batch_size=2), clips, runs / "base", vae, **quiet)
    with pytest.raises(ValueError, match="not finished"):  # an unfinished stage is not exported
        train_stage(
            WorldVideoConfig("ucpe", steps=2, batch_size=2),
            clips,
            runs / "ucpe",
            vae,
            base=world_video_transformer(**SMALL),
            stop_at=1,
            **quiet,
        )
        export_world_video(runs, tmp_path / "model", adapters=("ucpe",))
    from diffusers import WanTransformer3DModel

    base = WanTransformer3DModel.from_pretrained(runs / "base" / "transformer")
    train_stage(WorldVideoConfig("ucpe", steps=2, batch_size=2), clips, runs / "ucpe", vae, base=base, **quiet)
    train_stage(
        WorldVideoConfig("ucpe", steps=1, batch_size=2, init_from=str(runs / "ucpe")),
        clips,
        tmp_path / "continued" / "ucpe",
        vae,
        base=base,
        **quiet,
    )  # continued training of the adapter
    for name in ("vae", "base"):
        (tmp_path / "continued" / name).symlink_to(runs / name)
    folder = export_world_video(tmp_path / "continued", tmp_path / "assets" / "world-video", adapters=("ucpe",))
    card = json.loads((folder / "model_card.json").read_text())
    assert card["stages"]["ucpe"]["total_steps"] == 3 and "ucpe (continued)" in (folder / "README.md").read_text()
    for name in ("model_index.json", "README.md", "model_card.json", "samples.png", "camera-ucpe/config.json"):
        assert (folder / name).is_file(), name
    for card_file, kind in (("README.md", "video"), ("camera-ucpe/README.md", "camera-ucpe")):  # Hub front matter
        assert split_front_matter((folder / card_file).read_text())[0] == card_metadata(kind)
    with pytest.raises(FileExistsError, match="overwrite"):
        export_world_video(runs, folder, adapters=("ucpe",))
    check_a_second_export_into_one_new_folder(tmp_path / "continued", tmp_path / "raced", folder, monkeypatch)
    section = video_demo.camera_clips_section(tmp_path / "demo", root=tmp_path / "assets", steps=2)
    assert [label.split(": ")[1] for label, _ in section.rows[:3]] == ["ground truth", "no camera", "ucpe adapter"]
    assert len(section.rows) == 9 and all(frames.shape == (9, 32, 32, 3) for _, frames in section.rows)
    assert all(path.is_file() for path in section.diagnostics) and "RotErr" in section.note
    _generate_video_from_the_cli(folder, tmp_path)


def _generate_video_from_the_cli(folder, tmp_path):
    """``mmpos generate video --model FOLDER`` on a WorldVideoPipeline folder: mp4 of 9 frames at 32 px."""
    import cv2

    from mmpos.cli import main

    out = tmp_path / "video"
    assert (
        main(["generate", "video", "--model", str(folder), "--camera", "pan:-20", "--steps", "2", "--out", str(out)])
        == 0
    )
    capture, count = cv2.VideoCapture(str(out / "video.mp4")), 0
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        count += 1
        assert frame.shape == (32, 32, 3)
    assert count == 9 and (out / "rig.png").is_file()
    for bad_arguments in (["--camera", "spin:3"], ["--frames", "2x"], ["--extrapolate", "riflex"]):
        with pytest.raises(SystemExit) as bad:
            main(["generate", "video", "--model", str(folder), *bad_arguments, "--out", str(tmp_path / "x")])
        assert bad.value.code == 2


def test_shipped_plucker_adapter_reads_camera_ctrl_ordered_rays():
    """assets/world-video/camera-plucker was trained on (d, o x d) rays and converted once to CameraCtrl's
    (o x d, d) order: its output on today's rays equals the trained adapter's on the rays it was trained on."""
    from pathlib import Path

    from safetensors import safe_open

    from mmpos.camera import Cameras, reorder_plucker_inputs
    from mmpos.encodings import PluckerRays
    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter

    folder = Path(__file__).resolve().parents[2] / "assets" / "world-video" / "camera-plucker"
    with safe_open(str(folder / "diffusion_pytorch_model.safetensors"), "pt") as handle:
        assert handle.metadata()["plucker_order"] == "moment_direction"
    adapter = CameraAdapter.from_pretrained(folder).eval().double()
    trajectory = motion_trajectory(Motion("orbit", 35.0), start_pose(30.0))
    g = torch.Generator().manual_seed(0)
    rays = torch.nn.functional.normalize(torch.randn(16, 3, generator=g, dtype=torch.float64), dim=-1)
    c2w = trajectory.c2w[None, :3].double()  # [1, 3 frames, 4, 4], 16 rays per frame
    cameras = Cameras(c2w=c2w, grid=(4, 4), rays=rays)
    conditioning = adapter.conditioning(cameras)
    trained_order_rays = PluckerRays(None, order="direction_moment").prepare(cameras)
    hidden = torch.randn(1, 48, adapter.config.dim, generator=g, dtype=torch.float64)
    for layer, module in enumerate(adapter.layers):
        trained_weight = reorder_plucker_inputs(module.proj.weight, "moment_direction", "direction_moment")
        trained = hidden + trained_order_rays @ trained_weight.T + module.proj.bias
        torch.testing.assert_close(conditioning.attention_input(layer, hidden), trained, rtol=1e-12, atol=1e-12)
    assert (conditioning.attention_input(0, hidden) - hidden).abs().max() > 1e-3  # the adapter is not zero


def test_convert_plucker_adapter_permutes_the_input_weights_once(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    from mmpos.camera import reorder_plucker_inputs
    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter

    path = Path(__file__).resolve().parents[2] / "scripts" / "convert_plucker_adapter.py"
    spec = importlib.util.spec_from_file_location("convert_plucker_adapter", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    adapter = CameraAdapter(kind="plucker", dim=8, num_layers=2)
    with torch.no_grad():
        for p in adapter.parameters():
            p.normal_()
    adapter.save_pretrained(tmp_path / "old")  # no recorded order: trained on (d, o x d)
    assert script.main([str(tmp_path / "old")]) == 0
    converted = CameraAdapter.from_pretrained(tmp_path / "old")
    for before, after in zip(adapter.layers, converted.layers):
        assert torch.equal(after.proj.weight, reorder_plucker_inputs(before.proj.weight, "direction_moment"))
        assert torch.equal(after.proj.bias, before.proj.bias)
    assert script.main([str(tmp_path / "old")]) == 0  # recorded: left alone
    assert "already in moment_direction" in capsys.readouterr().out
    assert torch.equal(
        CameraAdapter.from_pretrained(tmp_path / "old").layers[0].proj.weight, converted.layers[0].proj.weight
    )
    CameraAdapter(kind="ucpe", dim=8, num_layers=1, head_dim=8).save_pretrained(tmp_path / "ucpe")
    with pytest.raises(SystemExit) as error:
        script.main([str(tmp_path / "ucpe")])
    assert error.value.code == 2 and "expected a plucker camera adapter" in capsys.readouterr().err


def check_a_second_export_into_one_new_folder(runs, out, finished, monkeypatch):
    """A second export into ``out`` started while the first writes it: a named error at once; the first's
    export is whole (the files of ``finished``, loadable); nothing else is left beside it."""
    from mmpos.pipelines.world import video_demo, video_export
    from mmpos.pipelines.world.video_export import export_world_video

    real_samples, second = video_export._write_samples, []

    def samples_while_a_second_export_starts(folder):
        if not second:  # only the first export starts a second one
            with pytest.raises(FileExistsError, match="another process is writing it") as error:
                second.append("started")
                export_world_video(runs, out, adapters=("ucpe",))
            second[0] = f"{type(error.value).__name__}: {error.value}"
        real_samples(folder)

    monkeypatch.setattr(video_export, "_write_samples", samples_while_a_second_export_starts)
    assert export_world_video(runs, out, adapters=("ucpe",)) == out
    assert second[0].startswith("ConcurrentWriteError: ") and str(out) in second[0]
    monkeypatch.setattr(video_export, "_write_samples", real_samples)
    names = lambda folder: sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))  # noqa: E731
    assert names(out) == names(finished)
    assert video_demo.load_video_model(out) is not None
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
