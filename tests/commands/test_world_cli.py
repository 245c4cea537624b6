"""``mmpos world``: files written with their ground truth; bad input is a clear usage error."""

import json

import numpy as np
import pytest
from PIL import Image

from mmpos.cli import main


def run_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_render_writes_image_and_ground_truth(tmp_path):
    out = tmp_path / "star"
    assert (
        main(
            [
                "world",
                "render",
                "--shape",
                "star",
                "--colour",
                "red",
                "--box",
                "8",
                "8",
                "40",
                "40",
                "--pattern",
                "stripes",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert {p.name for p in out.iterdir()} == {"scene.png", "scene.json"}
    truth = json.loads((out / "scene.json").read_text())
    x0, y0, x1, y1 = truth["boxes"][0]
    assert 8 <= x0 and 8 <= y0 and x1 <= 40 and y1 <= 40
    assert truth["caption"].startswith("a large striped red star")
    image = np.asarray(Image.open(out / "scene.png"))
    assert (image[0, 0] == 245).all() and (image[24, 24] != 245).any()  # white background, object inside


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shape", "blob"], "invalid choice: 'blob'"),
        (["--pattern", "plaid"], "invalid choice: 'plaid'"),
        (["--box", "10", "10", "80", "40"], "is not a box inside the 64x64 image"),
        (["--box", "30", "10", "20", "40"], "is not a box inside"),
    ],
)
def test_render_bad_input(argv, message, tmp_path, capsys):
    base = {"--shape": "star", "--colour": "red", "--box": ["8", "8", "40", "40"], "--out": str(tmp_path / "x")}
    args = ["world", "render"]
    for flag, value in base.items():
        if flag not in argv:
            args += [flag] + (value if isinstance(value, list) else [value])
    args += argv
    assert message in run_error(args, capsys)


def test_edits_write_pairs_and_reject_impossible_box(tmp_path, capsys):
    assert main(["world", "edits", "--kind", "harmonise", "--count", "1", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "harmonise-00000"
    assert {"collage.png", "target.png", "ground_truth.json"} <= {p.name for p in folder.iterdir()}
    err = run_error(
        ["world", "edits", "--kind", "transplant", "--box", "60", "60", "70", "70", "--out", str(tmp_path)], capsys
    )
    assert "box=(60, 60, 70, 70) is not a box inside" in err


@pytest.mark.parametrize(
    "command",
    [
        ["sample", "--caption", "a red star", "--checkpoint", "/nonexistent"],  # refused before loading anything
        ["render", "--shape", "star", "--colour", "red", "--box", "8", "8", "40", "40"],
        ["dataset", "--count", "1"],
        ["edits", "--kind", "style"],
        ["clip", "--frames", "1"],
    ],
)
def test_out_is_a_folder_in_every_world_command_and_a_file_name_is_refused_first(command, tmp_path, capsys):
    err = run_error(["world", *command, "--out", str(tmp_path / "samples.png")], capsys)
    assert f"--out {tmp_path / 'samples.png'}: expected a folder" in err
    assert not list(tmp_path.iterdir())
    (tmp_path / "notes").write_text("mine")
    assert "expected a folder" in run_error(["world", *command, "--out", str(tmp_path / "notes")], capsys)


def test_sample_writes_an_image_per_caption_and_the_grid_into_its_folder(tmp_path):
    captions = ["a large red star at center", "a small blue circle at top left"]
    assert main(["world", "sample", "--caption", *captions, "--steps", "2", "--out", str(tmp_path / "s")]) == 0
    assert {p.name for p in (tmp_path / "s").iterdir()} == {"image_0.png", "image_1.png", "samples.png"}
    assert Image.open(tmp_path / "s" / "image_1.png").size == (32, 32)


def test_sample_with_missing_checkpoint_or_unknown_word(tmp_path, capsys):
    err = run_error(["world", "sample", "--caption", "a red star", "--checkpoint", str(tmp_path)], capsys)
    assert "no VAE checkpoint at" in err and "scripts/train_world.py" in err


def test_dataset_writes_image_folder(tmp_path):
    assert main(["world", "dataset", "--count", "3", "--out", str(tmp_path)]) == 0
    assert len((tmp_path / "metadata.jsonl").read_text().splitlines()) == 3


def test_clip_writes_frames_and_cameras(tmp_path, capsys):
    assert main(["world", "clip", "--frames", "2", "--size", "16", "--out", str(tmp_path)]) == 0
    truth = np.load(tmp_path / "ground_truth.npz")
    assert truth["poses"].shape == (2, 4, 4) and truth["depth"].shape == (2, 16, 16)
    assert (tmp_path / "frame_001.png").is_file()
    assert "argument --fov: expected a number in (0, 180)" in run_error(
        ["world", "clip", "--fov", "200", "--out", str(tmp_path)], capsys
    )
    saved = tmp_path / "trajectory.json"  # the clip's cameras, reloadable as a trajectory file
    assert (
        main(
            [
                "world",
                "clip",
                "--frames",
                "3",
                "--size",
                "16",
                "--trajectory",
                str(saved),
                "--out",
                str(tmp_path / "again"),
            ]
        )
        == 0
    )
    assert np.load(tmp_path / "again" / "ground_truth.npz")["poses"].shape == (3, 4, 4)
    assert (
        main(["world", "clip", "--frames", "2", "--size", "16", "--trajectory", "pan", "--out", str(tmp_path / "pan")])
        == 0
    )
    ids = np.load(tmp_path / "pan" / "ground_truth.npz")["ids"]
    assert (ids == -1).any() and (ids >= 0).any()  # placed on the scene: ground and objects in view
    assert "not a preset" in run_error(["world", "clip", "--trajectory", "spin", "--out", str(tmp_path)], capsys)
    assert "--degrees and --fov shape the default orbit" in run_error(
        ["world", "clip", "--trajectory", "pan", "--fov", "50", "--out", str(tmp_path)], capsys
    )


def test_clip_textured_keeps_depth_and_changes_colours(tmp_path):
    from PIL import Image

    for name, extra in (("flat", []), ("textured", ["--textured"])):
        assert main(["world", "clip", "--frames", "2", "--size", "16", "--out", str(tmp_path / name)] + extra) == 0
    flat, textured = (np.load(tmp_path / n / "ground_truth.npz") for n in ("flat", "textured"))
    assert np.array_equal(flat["depth"], textured["depth"]) and np.array_equal(flat["ids"], textured["ids"])
    images = [np.asarray(Image.open(tmp_path / n / "frame_000.png")) for n in ("flat", "textured")]
    assert not np.array_equal(*images)
