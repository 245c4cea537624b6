"""`mmpos viz cameras` and the camera figures of the demo."""

import pytest
import torch

from mmpos.camera import frustum_lines, preset_trajectory, save_trajectory
from mmpos.cli import main
from mmpos.viz.cameras import encoding_logit_maps


def test_viz_cameras_from_a_re10k_file_and_a_preset(tmp_path, capsys):
    path = save_trajectory(preset_trajectory("arc", 12), tmp_path / "arc_clip.txt")
    assert main(["viz", "cameras", str(path), "--out", str(tmp_path / "a"), "--frame", "-1", "--grid", "6", "8"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "a" / "arc_clip_rig.png"), str(tmp_path / "a" / "arc_clip_rays.png")]
    assert (
        main(
            [
                "viz",
                "cameras",
                "preset:pan",
                "--out",
                str(tmp_path / "b"),
                "--frames",
                "5",
                "--model",
                "unified",
                "--fov",
                "190",
                "--xi",
                "1.8",
            ]
        )
        == 0
    )
    for folder, stem in (("a", "arc_clip"), ("b", "pan")):
        for kind in ("rig", "rays"):
            figure = tmp_path / folder / f"{stem}_{kind}.png"
            assert figure.stat().st_size > 10_000


def test_viz_cameras_errors(tmp_path, capsys):
    """User errors are one line naming the input, exit code 2 (issue 35; they were tracebacks)."""
    bad = tmp_path / "bad.txt"
    bad.write_text("url\n1 2 3 4\n")
    for argv, match in (
        ([str(tmp_path / "missing.txt")], "preset:NAME"),
        ([str(bad)], "4 columns"),
        (["preset:roll", "--frames", "4", "--frame", "9"], "--frame 9"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["viz", "cameras", *argv, "--out", str(tmp_path)])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and match in err and len(err.strip().splitlines()) == 1, err


def test_frustum_of_the_identity_camera():
    lines = frustum_lines(
        torch.eye(4, dtype=torch.float64), torch.tensor([1.0, 1.0, 0.5, 0.5], dtype=torch.float64), 2.0
    )
    far = lines[:4, 1]
    assert torch.allclose(far[:, 2], torch.full((4,), 2.0, dtype=torch.float64))
    assert torch.allclose(far[:, :2].abs(), torch.ones(4, 2, dtype=torch.float64))  # half-width 0.5/1 at depth 2


@pytest.mark.parametrize("name", ["prope", "ucpe", "rayrope", "plucker"])
def test_encoding_logit_maps_peak_at_the_query_token(name):
    same, other = encoding_logit_maps(name, grid_size=(5, 7), image_size=(50, 70))
    assert same[2, 3] == pytest.approx(1.0, abs=1e-9) and same.max() <= 1 + 1e-9
    assert torch.isfinite(other).all() and not torch.allclose(other, same)


def test_viz_help(capsys):
    for argv in (["viz", "--help"], ["viz", "cameras", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: mmpos viz cameras" in out and "preset:NAME" in out
