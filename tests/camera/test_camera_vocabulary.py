"""One camera-motion vocabulary for every model and command (issue 31, item 5): ``orbit``, ``arc``, ``dolly``,
``pan``, ``tilt``, ``roll``, ``zoom`` with signed amounts, the earlier ``dolly_in`` ... names as aliases, on the
Wan / tiny path, the world video model (trained on orbit, dolly, pan: the others run with one note line),
``viz cameras`` and ``world clip``, and in every ``--help``."""

from __future__ import annotations

import math

import pytest
import torch

from mmpos._camera_motions import ALIASES, MOTIONS, parse_motion
from mmpos.camera.specs import resolve_trajectory
from mmpos.cli import main

AMOUNTS = {"orbit": 35.0, "arc": 50.0, "dolly": -0.5, "pan": -20.0, "tilt": 10.0, "roll": 15.0, "zoom": 0.5}
SPECS = [
    f"{prefix}{name}{suffix}" for name in (*MOTIONS, *ALIASES) for prefix in ("", "preset:") for suffix in ("", ":0.8")
]


def rotation_degrees(c2w) -> float:
    """Angle of the rotation from the first camera to the last (fp64)."""
    relative = c2w[0, :3, :3].T @ c2w[-1, :3, :3]
    return math.degrees(math.acos(max(-1.0, min(1.0, (float(torch.trace(relative)) - 1) / 2))))


@pytest.mark.parametrize("name", MOTIONS)
def test_each_motion_moves_by_its_signed_amount(name):
    trajectory = resolve_trajectory(f"{name}:{AMOUNTS[name]}", 9)
    c2w, amount = trajectory.c2w, AMOUNTS[name]
    if name in ("orbit", "arc", "pan", "tilt", "roll"):
        assert rotation_degrees(c2w) == pytest.approx(abs(amount), abs=1e-9)
    if name in ("pan", "tilt", "roll"):  # turns about y (pan), x (tilt), z (roll): that axis is fixed
        axis = {"pan": 1, "tilt": 0, "roll": 2}[name]
        assert torch.allclose(c2w[-1, :3, axis], c2w[0, :3, axis], atol=1e-12)
        assert torch.equal(c2w[:, :3, 3], torch.zeros(9, 3, dtype=c2w.dtype))
    if name == "dolly":  # along the optical axis, signed (negative: out)
        assert c2w[-1, :3, 3].tolist() == pytest.approx([0.0, 0.0, amount], abs=1e-12)
    if name == "zoom":
        assert float(trajectory.intrinsics[-1, 0] / trajectory.intrinsics[0, 0]) == pytest.approx(amount)
    if name == "orbit":  # the camera moves left for positive degrees
        assert float(c2w[-1, 0, 3]) < 0
    if name == "arc":  # centred on the identity camera
        assert rotation_degrees(c2w[[0, 4]]) == pytest.approx(abs(amount) / 2, abs=1e-9)
        assert torch.allclose(c2w[4], torch.eye(4, dtype=c2w.dtype), atol=1e-12)


def test_aliases_are_dolly_and_zoom_with_their_direction():
    assert parse_motion("dolly_in:0.3") == parse_motion("dolly:0.3") == parse_motion("preset:dolly_in:-0.3")
    assert parse_motion("dolly_out") == parse_motion("dolly:-1")
    assert parse_motion("zoom_out:2") == parse_motion("zoom:0.5") == parse_motion("zoom_out:0.5")
    assert parse_motion("zoom_in") == parse_motion("zoom:2")


@pytest.mark.parametrize(
    "bad,message",
    [
        ("preset:spin", "unknown camera motion 'spin'; expected one of orbit, arc, dolly, pan, tilt, roll, zoom"),
        ("orbit:fast", "finite number"),
        ("zoom:-2", "zoom factor must be positive"),
    ],
)
def test_bad_motions_are_refused_naming_the_vocabulary(bad, message):
    with pytest.raises(ValueError, match=message):
        resolve_trajectory(bad, 5)


def test_every_name_on_the_wan_and_tiny_path():
    from mmpos.pipelines.commands.generate.video import _trajectory

    class Args:
        camera = None

    for spec in SPECS:
        Args.camera = spec
        assert len(_trajectory(Args, None, 9)) == 9, spec


def test_every_name_on_the_world_video_model_path(capsys):
    from mmpos.pipelines.commands.generate.world_video import world_trajectory

    def fail(message):
        raise AssertionError(message)

    for spec in SPECS:
        trajectory = world_trajectory(spec, 9, fail)
        note = capsys.readouterr().out.splitlines()
        untrained = parse_motion(spec).name not in ("orbit", "dolly", "pan")
        assert len(trajectory) == 9 and len(note) == int(untrained), (spec, note)
        if untrained:
            assert note[0].startswith(
                "camera: the world video model was trained on orbit, dolly and pan only; "
                f"running {parse_motion(spec)} anyway"
            )
        assert torch.allclose(trajectory.intrinsics[:, 0], trajectory.intrinsics[:, 1])  # square world frames
    messages = []
    with pytest.raises(AssertionError):
        world_trajectory("spin:3", 9, lambda m: (messages.append(m), fail(m)))
    assert "orbit[:DEGREES], arc[:DEGREES], dolly[:UNITS]" in messages[0]


def test_world_model_trained_motion_keeps_its_trajectory():
    """``orbit``/``dolly``/``pan`` on the world model are its training motions (amounts default to its own)."""
    from mmpos.eval.video_eval import EVAL_MOTIONS
    from mmpos.pipelines.commands.generate.world_video import world_trajectory
    from mmpos.pipelines.world.video_demo import DEMO_START_DEGREES
    from mmpos.world.video_data import Motion, motion_trajectory, start_pose

    for name in ("orbit", "dolly", "pan"):
        expected = motion_trajectory(Motion(name, EVAL_MOTIONS[name]), start_pose(DEMO_START_DEGREES), 9)
        assert torch.equal(world_trajectory(f"preset:{name}", 9, None).c2w, expected.c2w)


def test_help_lists_the_vocabulary(capsys):
    for command in (["generate", "video"], ["viz", "cameras"], ["world", "clip"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert all(f"{name}[:" in text for name in MOTIONS) and "dolly_in" in text, command


def test_viz_cameras_and_world_clip_take_the_vocabulary(tmp_path):
    assert main(["viz", "cameras", "tilt:-15", "--frames", "3", "--out", str(tmp_path / "viz")]) == 0
    assert (tmp_path / "viz" / "tilt_-15_rig.png").is_file()
    assert (
        main(
            [
                "world",
                "clip",
                "--trajectory",
                "zoom:1.5",
                "--frames",
                "2",
                "--size",
                "16",
                "--out",
                str(tmp_path / "clip"),
            ]
        )
        == 0
    )
