"""Issue 35: a user error is one line naming the argument (exit code 2), never a traceback; library misuse raises a
named ValueError / TypeError; numpy scalars are numbers."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from mmpos.pipelines.commands import main

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = ROOT / "assets" / "world-video" / "camera-ucpe"


def _frames(c2w=None, intrinsics=(1.0, 1.0, 0.5, 0.5), count=3):
    eye = [[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 1.0]]
    return [{"timestamp": i, "c2w": eye if c2w is None else c2w, "intrinsics": list(intrinsics)} for i in range(count)]


def _trajectory_file(tmp_path, name: str, frames=None, raw: bytes | None = None) -> str:
    path = tmp_path / name
    if raw is not None:
        path.write_bytes(raw)
    else:
        path.write_text(json.dumps({"format": "mmpos.trajectory", "frames": frames}))
    return str(path)


BAD_TRAJECTORIES = {  # name -> (file contents, what the message must say)
    "not_utf8.json": (dict(raw=b"\xff\xfe{}"), "UTF-8"),
    "not_utf8.txt": (dict(raw=b"\xff\xfe 1 2 3"), "UTF-8"),
    "frames_dict.json": (dict(frames={"a": 1}), "frames must be a non-empty list"),
    "frames_ints.json": (dict(frames=[1, 2]), "frames[0] must be an object"),
    "strings.json": (
        dict(frames=_frames(c2w=[["1", 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])),
        "frames[0].c2w[0][0] must be a number",
    ),
    "string_focal.json": (dict(frames=_frames(intrinsics=("1", 1, 0.5, 0.5))), "frames[0].intrinsics"),
    "nan_pose.json": (
        dict(frames=_frames(c2w=[[1, 0, 0, float("nan")], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])),
        "non-finite",
    ),
}


def _one_line_exit_2(capsys, argv, *named, runner=main):
    with pytest.raises(SystemExit) as exit_info:
        runner(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and "%|" not in line]  # tqdm bars aside
    assert len(lines) == 1, err
    for word in named:
        assert word in lines[0], lines[0]
    return lines[0]


# ----- trajectory files: the loader names the file and the field ---------------------------------------------


@pytest.mark.parametrize("name", sorted(BAD_TRAJECTORIES))
def test_bad_trajectory_file_is_a_named_value_error(tmp_path, name):
    from mmpos.camera import load_trajectory

    contents, expected = BAD_TRAJECTORIES[name]
    path = _trajectory_file(tmp_path, name, **contents)
    with pytest.raises(ValueError) as error:
        load_trajectory(path)
    assert path in str(error.value) and expected in str(error.value)


def test_numpy_numbers_in_a_good_trajectory_still_load(tmp_path):
    from mmpos.camera import load_trajectory

    trajectory = load_trajectory(_trajectory_file(tmp_path, "good.json", _frames()))
    assert len(trajectory) == 3 and torch.equal(trajectory.c2w[0], torch.eye(4, dtype=torch.float64))


# ----- mmpos viz cameras -----------------------------------------------------------------------------------------

VIZ_CASES = {
    "unknown preset": (["preset:bogus"], ["TRAJECTORY preset:bogus", "orbit"]),
    "zero frames": (["preset:orbit", "--frames", "0"], ["--frames"]),
    "frame outside": (["preset:orbit", "--frames", "5", "--frame", "9"], ["--frame 9", "5 frames"]),
    "zero grid": (["preset:orbit", "--grid", "0", "4"], ["--grid"]),
    "nan fov": (["preset:orbit", "--model", "unified", "--fov", "nan"], ["--fov"]),
    "missing file": (["no_such_trajectory.json"], ["no_such_trajectory.json", "not found"]),
}


@pytest.mark.parametrize("case", sorted(VIZ_CASES))
def test_viz_cameras_user_errors(tmp_path, capsys, case):
    argv, named = VIZ_CASES[case]
    _one_line_exit_2(capsys, ["viz", "cameras", *argv, "--out", str(tmp_path / "out")], *named)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", sorted(BAD_TRAJECTORIES))
def test_viz_cameras_bad_trajectory_files(tmp_path, capsys, name):
    contents, expected = BAD_TRAJECTORIES[name]
    path = _trajectory_file(tmp_path, name, **contents)
    _one_line_exit_2(capsys, ["viz", "cameras", path, "--out", str(tmp_path / "out")], name, expected)


# ----- mmpos generate video --------------------------------------------------------------------------------------


def test_generate_video_nan_camera_scale(capsys, tmp_path):
    _one_line_exit_2(capsys, ["generate", "video", "--camera-scale", "nan", "--out", str(tmp_path)], "--camera-scale")


def test_generate_video_out_is_a_file(capsys, tmp_path):
    out = tmp_path / "taken"
    out.write_text("mine")
    _one_line_exit_2(capsys, ["generate", "video", "--model", "tiny", "--out", str(out)], "--out", "folder")
    assert out.read_text() == "mine"


@pytest.mark.skipif(not (ROOT / "assets" / "world-video" / "model_index.json").is_file(), reason="no world video model")
@pytest.mark.parametrize("name", ["nan_pose.json", "frames_dict.json", "strings.json", "not_utf8.json"])
def test_generate_video_bad_camera_file(capsys, tmp_path, name):
    contents, expected = BAD_TRAJECTORIES[name]
    path = _trajectory_file(tmp_path, name, **contents)
    _one_line_exit_2(
        capsys,
        ["generate", "video", "--model", "world", "--camera", path, "--out", str(tmp_path / "out")],
        "--camera",
        expected,
    )


def test_mismatched_camera_adapter_is_refused_when_loaded():
    from mmpos.models.tiny_wan import tiny_wan_components
    from mmpos.pipelines import CameraControlWanPipeline, load_camera_adapter

    pipe = CameraControlWanPipeline(**tiny_wan_components())
    with pytest.raises(ValueError, match="the adapter has 4 layers of width 128; the transformer has 2"):
        load_camera_adapter(pipe, ADAPTER)
    assert pipe.camera_adapter is None


@pytest.mark.skipif(not (ROOT / "assets" / "world-video" / "model_index.json").is_file(), reason="no world video model")
def test_generate_video_world_mismatched_adapter(capsys, tmp_path):
    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter

    other = tmp_path / "other-adapter"
    CameraAdapter(kind="ucpe", dim=32, num_layers=2, num_heads=2, head_dim=16).save_pretrained(other)
    _one_line_exit_2(
        capsys,
        ["generate", "video", "--model", "world", "--adapter", str(other), "--out", str(tmp_path / "out")],
        "--adapter",
        "2 layers of width 32",
    )
    assert not (tmp_path / "out").exists()


# ----- mmpos generate: the config's extrapolate section, non-UTF-8 configs ------------------------------------------

GENERATE_CASES = {
    "train_size text": (["--set", "extrapolate.train_size=abc"], ["extrapolate.train_size='abc'"]),
    "unknown option": (
        ["--extrapolate", "ntk", "--set", "extrapolate.options={bogus: 1}"],
        ["extrapolate.options", "bogus", "lambda_t"],
    ),
    "option text": (
        ["--extrapolate", "dype", "--set", "extrapolate.options={lambda_t: abc}"],
        ["extrapolate.options", "lambda_t"],
    ),
}


@pytest.mark.parametrize("case", sorted(GENERATE_CASES))
def test_generate_extrapolate_setting(capsys, tmp_path, case):
    argv, named = GENERATE_CASES[case]
    _one_line_exit_2(capsys, ["generate", "--model", "world", *argv, "--out", str(tmp_path / "out")], *named)


def test_generate_non_utf8_config(capsys, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_bytes(b"prompts: [\xff\xfe]\n")
    _one_line_exit_2(
        capsys,
        ["generate", "--model", "world", "--config", str(config), "--out", str(tmp_path / "o")],
        str(config),
        "UTF-8",
    )


# ----- scripts -----------------------------------------------------------------------------------------------------


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ucpe_files(tmp_path) -> dict:
    torch.save([1, 2], tmp_path / "list.pt")
    torch.save({"a": torch.zeros(2)}, tmp_path / "foreign.pt")
    torch.save({"blocks.0.cam_self_attn.q_proj.weight": torch.zeros(16, 8)}, tmp_path / "partial.pt")
    (tmp_path / "garbage.safetensors").write_bytes(b"not a safetensors file")
    (tmp_path / "taken").mkdir()
    return {
        "missing": (["nope.ckpt", "o"], ["nope.ckpt"]),
        "folder": ([str(tmp_path), "o"], [str(tmp_path)]),
        "list": ([str(tmp_path / "list.pt"), "o"], ["list.pt", "dict of tensors"]),
        "foreign": ([str(tmp_path / "foreign.pt"), "o"], ["foreign.pt", "no UCPE adapter keys"]),
        "partial": ([str(tmp_path / "partial.pt"), "o"], ["partial.pt", "do not fit"]),
        "garbage": ([str(tmp_path / "garbage.safetensors"), "o"], ["garbage.safetensors", "cannot be read"]),
        "heads": ([str(tmp_path / "foreign.pt"), "o", "--num-heads", "0"], ["--num-heads"]),
        "out exists": ([str(tmp_path / "foreign.pt"), str(tmp_path / "taken")], ["OUT", "taken"]),
    }


@pytest.mark.parametrize("case", ["missing", "folder", "list", "foreign", "partial", "garbage", "heads", "out exists"])
def test_convert_ucpe_checkpoint_user_errors(tmp_path, capsys, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    argv, named = _ucpe_files(tmp_path)[case]
    _one_line_exit_2(capsys, argv, *named, runner=_script("convert_ucpe_checkpoint").main)
    assert not (tmp_path / "o").exists()


def test_eval_nvs_negative_steps(capsys, tmp_path):
    _one_line_exit_2(
        capsys,
        ["--out", str(tmp_path), "train", "--encoding", "rayrope", "--steps", "-1"],
        "--steps",
        runner=_script("eval_nvs").main,
    )


def test_overwrite_through_a_symlinked_run_folder_is_named(tmp_path):
    from mmpos.training.scaffold.folders import RunExistsError, check_run_folder

    target = tmp_path / "real"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    link = tmp_path / "link"
    os.symlink(target, link)
    with pytest.raises(RunExistsError, match="--output-dir .*symbolic link.*untouched"):
        check_run_folder(link, resume=False, overwrite=True)
    assert (target / "keep.txt").read_text() == "mine"


def test_world_clip_overwrite_leaves_no_stale_frames(tmp_path, capsys):
    out = tmp_path / "clip"
    base = ["world", "clip", "--out", str(out), "--size", "16", "--objects", "1"]
    assert main(base + ["--frames", "6"]) == 0
    (out / "notes.txt").write_text("mine")
    assert main(base + ["--frames", "2", "--overwrite"]) == 0
    assert sorted(p.name for p in out.glob("frame_*.png")) == ["frame_000.png", "frame_001.png"]
    assert (out / "notes.txt").read_text() == "mine"  # only the clip's own frames go
    from mmpos.camera import load_trajectory

    assert len(load_trajectory(out / "trajectory.json")) == 2


# ----- library ----------------------------------------------------------------------------------------------------


def test_numpy_scalars_are_numbers():
    from mmpos.camera.models import Pinhole

    camera = Pinhole(fx=np.float32(100), fy=np.int64(90), cx=np.float64(50), cy=50, width=100, height=100)
    assert (camera.fx, camera.fy) == (100.0, 90.0)
    with pytest.raises(ValueError, match="fx must be a finite number"):
        Pinhole(fx=np.float32("nan"), fy=100, cx=50, cy=50, width=100, height=100)


def test_flux_ids_negative_text_length():
    from mmpos.coords.grids import flux_ids

    with pytest.raises(ValueError, match="text_length must be a non-negative integer, got -1"):
        flux_ids(2, 2, text_length=-1)


def test_rotate_with_a_raw_tensor_for_the_table():
    import mmpos
    from mmpos.coords.grids import grid_coords
    from mmpos.ops.rotation import rotate

    table = mmpos.create_pe("rope_axial", head_dim=16).table(grid_coords((2, 2)))
    q = torch.randn(1, 1, 4, 16)
    with pytest.raises(TypeError, match=r"table must be a RotaryTable, got Tensor \(pass the RotaryTable"):
        rotate(q, table.cis)
    assert rotate(q, table).shape == q.shape


def test_meta_device_q_is_a_named_error():
    import mmpos
    from mmpos.coords.grids import grid_coords

    q = torch.empty(1, 2, 4, 16, device="meta")
    with pytest.raises(ValueError, match="meta device"):
        mmpos.create_pe("rope_axial", head_dim=16)(q, q, grid_coords((2, 2)))


def test_prope_refuses_a_distorted_opencv_camera():
    from mmpos.camera import preset_trajectory
    from mmpos.camera.perspective import OpenCVCamera
    from mmpos.camera.video import video_cameras
    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter

    c2w = preset_trajectory("orbit", 3).c2w
    plain = OpenCVCamera(40.0, 40.0, 32.0, 32.0, 64, 64)
    distorted = OpenCVCamera(40.0, 40.0, 32.0, 32.0, 64, 64, k1=-0.05)
    assert video_cameras((c2w, plain), (3, 4, 4), (64, 64)).intrinsics is not None  # no distortion: exactly a K
    cameras = video_cameras((c2w, distorted), (3, 4, 4), (64, 64))
    assert cameras.intrinsics is None
    adapter = CameraAdapter(kind="prope", dim=32, num_layers=1, num_heads=2, head_dim=16)
    with pytest.raises(ValueError, match="distortion"):
        adapter.conditioning(cameras, 1.0)
