"""scripts/train_camera_adapter.py on `mmpos world clip` output with the tiny offline Wan: a few steps,
checkpoints, and a resume that takes exactly the step an uninterrupted run takes."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import mmpos.training.tasks.camera_adapter as task_module
from mmpos.integrations.diffusers.camera_adapter import CameraAdapter
from mmpos.training import camera_clips
from tests.fixtures.world_clips import write_world_clips

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_camera_adapter.py"


def load_script():
    spec = importlib.util.spec_from_file_location("train_camera_adapter", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def world_clips(tmp_path_factory):
    data = write_world_clips(tmp_path_factory.mktemp("clips"), 2)
    (data / "clip_1" / "caption.txt").write_text("a camera orbit around the scene")
    return data


def args(data, out, steps, *extra):
    return [
        "--data",
        str(data),
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--checkpoint-every",
        "2",
        "--frames",
        "5",
        "--max-sequence-length",
        "16",
        "--head-dim",
        "16",
        "--max-zoom",
        "1.3",
        "--lr",
        "1e-2",
        *extra,
    ]


def test_training_checkpoints_and_resumes_to_the_identical_next_loss(world_clips, tmp_path, capsys):
    script = load_script()
    straight = script.train(args(world_clips, tmp_path / "straight", 3, "--gradient-checkpointing"))
    first = script.train(args(world_clips, tmp_path / "resumed", 2, "--gradient-checkpointing"))
    assert first == {1: straight[1], 2: straight[2]}
    with pytest.raises(SystemExit) as exit_info:
        script.train(args(world_clips, tmp_path / "resumed", 3))
    assert exit_info.value.code == 2 and "holds an earlier run (checkpoint-2" in capsys.readouterr().err
    resumed = script.train(args(world_clips, tmp_path / "resumed", 3, "--gradient-checkpointing", "--resume"))
    assert resumed == {3: straight[3]}
    assert all(torch.isfinite(torch.tensor(list(straight.values()))))
    saved = CameraAdapter.from_pretrained(tmp_path / "resumed" / "checkpoint-3" / "adapter")
    assert saved.layers[0].out_proj.weight.abs().max() > 0  # trained away from the zero initialisation
    final = CameraAdapter.from_pretrained(tmp_path / "straight" / "checkpoint-3" / "adapter")
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), final.state_dict().values()))
    log = [json.loads(line) for line in (tmp_path / "resumed" / "log.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in log] == [1, 2, 3]
    assert not list((tmp_path / "resumed").glob(".checkpoint-*"))  # temporaries renamed into place


def test_only_the_adapter_trains(world_clips, tmp_path, monkeypatch):
    script = load_script()
    seen = {}
    original = torch.optim.AdamW

    def spy(params, **kwargs):
        params = list(params)
        seen["count"] = sum(p.numel() for p in params)
        return original(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", spy)
    script.train(args(world_clips, tmp_path / "run", 1, "--kind", "plucker"))
    pipe = task_module.load_parts("tiny", torch.float32)
    adapter = CameraAdapter.for_transformer(pipe.transformer, "plucker")
    assert seen["count"] == sum(p.numel() for p in adapter.parameters()) == 2 * (6 * 24 + 24)


def test_lens_augmentation_trains_on_rerendered_frames_with_their_models_rays(world_clips, tmp_path, monkeypatch):
    script = load_script()
    drawn, cameras = [], []
    original_load, original_cameras = camera_clips.load_sample, task_module.video_cameras

    def load(*a, **kwargs):
        drawn.append(kwargs.get("lens"))
        return original_load(*a, **kwargs)

    def record(camera, *a, **kwargs):
        cameras.append(camera)
        return original_cameras(camera, *a, **kwargs)

    monkeypatch.setattr(camera_clips, "load_sample", load)
    monkeypatch.setattr(task_module, "video_cameras", record)
    losses = script.train(
        args(world_clips, tmp_path / "lens", 4, "--lens-models", "opencv", "unified", "--batch-size", "2")
    )
    assert all(torch.isfinite(torch.tensor(list(losses.values()))))
    assert {lens["model"] for lens in drawn} <= {"opencv", "unified"} and len(drawn) == 8
    assert all(type(c.models[0]).__name__ in ("OpenCVCamera", "UnifiedCamera") for c in cameras)
