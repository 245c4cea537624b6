"""``mmpos generate video`` on the tiny offline Wan components."""

import math

import numpy as np
import pytest

from mmpos.cli import main
from mmpos.integrations.diffusers.camera_adapter import CameraAdapter
from mmpos.models.tiny_wan import tiny_wan_transformer
from mmpos.pipelines.commands.generate.video import extrapolation_policies, riflex_k

SMALL = ["--model", "tiny", "--frames", "9", "--height", "32", "--width", "48", "--steps", "2"]


def read_video(path):
    import cv2

    capture = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, frame = capture.read()
        if not ok:
            return np.stack(frames)
        frames.append(frame)


def test_tiny_text_to_video_writes_mp4_grid_and_rig_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "video"
    assert main(["generate", "video", "--out", str(out), "--camera", "preset:pan", *SMALL]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("model: tiny offline") and lines[1] == "device: cpu" and lines[2] == "dtype: float32"
    assert read_video(out / "video.mp4").shape == (9, 32, 48, 3)
    assert (out / "frames.png").stat().st_size > 1000 and (out / "rig.png").stat().st_size > 10_000
    before = (out / "video.mp4").read_bytes()
    with pytest.raises(SystemExit) as refused:
        main(["generate", "video", "--out", str(out), *SMALL])
    assert refused.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert (out / "video.mp4").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == [
        "frames.png",
        "rig.png",
        "video.gif",
        "video.mp4",
    ]  # no temporary left


def test_image_to_video_with_an_adapter_and_riflex(tmp_path, capsys):
    from PIL import Image

    adapter = CameraAdapter.for_transformer(tiny_wan_transformer(image_to_video=True), "ucpe", head_dim=16)
    adapter.save_pretrained(tmp_path / "adapter")
    Image.fromarray(np.full((40, 60, 3), 128, np.uint8)).save(tmp_path / "first.png")
    out = tmp_path / "i2v"
    assert (
        main(
            [
                "generate",
                "video",
                "--out",
                str(out),
                "--image",
                str(tmp_path / "first.png"),
                "--adapter",
                str(tmp_path / "adapter"),
                "--extrapolate",
                "riflex",
                "--train-frames",
                "5",
                *SMALL,
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "camera adapter: ucpe" in printed and "'type': 'riflex'" in printed
    assert read_video(out / "video.mp4").shape == (9, 32, 48, 3)


@pytest.mark.parametrize(
    "bad,message",
    [
        (["--frames", "10"], "4k + 1"),
        (["--height", "40"], "multiple of 16"),
        (["--camera", "nowhere.txt"], "--camera nowhere.txt"),
        (["--adapter", "/nonexistent/adapter"], "--adapter /nonexistent/adapter"),
        (["--model", "/nonexistent/wan"], "--model /nonexistent/wan"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, bad, message):
    with pytest.raises(SystemExit) as error:
        main(["generate", "video", "--out", str(tmp_path / "x"), *SMALL, *bad])
    assert error.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x" / "video.mp4").exists()


def test_riflex_picks_the_time_pair_whose_period_is_closest_to_the_trained_length():
    from diffusers import WanTransformer3DModel

    wan13b_head = WanTransformer3DModel(
        num_attention_heads=1,
        attention_head_dim=128,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        ffn_dim=8,
        num_layers=1,
    )  # Wan2.1-1.3B's head: 44 time channels
    # periods 2 pi 10000^(2j/44): 6.3, 9.5, 14.5, 22.1, 33.7, ...: 21 latent frames (81 video frames) -> pair 4
    assert riflex_k(wan13b_head, 21) == 4
    assert riflex_k(wan13b_head, 30) == 5
    assert riflex_k(tiny_wan_transformer(), 21) == 1  # tiny: 4 time channels, periods 6.3 and 628


def test_riflex_k_from_the_observed_repeat_hunyuan_video():
    from mmpos.spectrum.extrapolation import riflex_intrinsic_k

    periods = [2 * math.pi * 256.0 ** (2 * j / 16) for j in range(8)]  # HunyuanVideo: 16 time channels, theta 256
    closest = [1 + min(range(8), key=lambda j: abs(periods[j] - n)) for n in range(1, 130)]
    assert [riflex_intrinsic_k(16, 256.0, n) for n in range(1, 130)] == closest
    assert riflex_intrinsic_k(16, 256.0, 33) == 3  # the trained 33 latents as N
    assert riflex_intrinsic_k(16, 256.0, 38) == 4 == riflex_intrinsic_k(16, 256.0, 75)  # the authors' k = 4
    with pytest.raises(ValueError, match="repeat_length must be a positive"):
        riflex_intrinsic_k(16, 256.0, 0)
    with pytest.raises(ValueError, match="time_dim must be an int >= 2"):
        riflex_intrinsic_k(1, 256.0, 33)


def test_riflex_repeat_sets_n_from_the_observed_repeat(tmp_path, capsys):
    from diffusers import WanTransformer3DModel

    wan13b_head = WanTransformer3DModel(
        num_attention_heads=1,
        attention_head_dim=128,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        ffn_dim=8,
        num_layers=1,
    )
    time, _, _ = extrapolation_policies(["riflex"], wan13b_head, 161, 81, (480, 832))
    assert time["k"] == 4  # N = 21 trained latents
    time, _, _ = extrapolation_policies(["riflex"], wan13b_head, 161, 81, (480, 832), repeat_frames=129)
    assert time == {"type": "riflex", "k": 5, "target_length": 41}  # N = 33 latents: period 33.7 is closest
    with pytest.raises(SystemExit) as error:
        main(["generate", "video", "--out", str(tmp_path / "x"), *SMALL, "--riflex-repeat", "0"])
    assert error.value.code == 2 and "--riflex-repeat" in capsys.readouterr().err


def test_extrapolation_policies_per_axis():
    from mmpos.pipelines.commands.generate.video import SPATIAL
    from mmpos.spectrum.extrapolation import make_policy
    from mmpos.spectrum.schedule import PRESETS

    assert SPATIAL == tuple(PRESETS)
    wan = tiny_wan_transformer()
    time, rows, cols = extrapolation_policies(["riflex", "ntk"], wan, 161, 81, (480, 832))
    assert time == {"type": "riflex", "k": 1, "target_length": 41}
    assert rows.original_length == 30 and cols.original_length == 52  # trained patches (16 px each)
    assert rows.policy(30) == make_policy(None) and cols.policy(104) == make_policy({"type": "ntk", "factor": 2.0})
    _, yarn_rows, _ = extrapolation_policies(["yarn"], wan, 81, 81, (480, 832))
    assert yarn_rows.policy(60) == make_policy({"type": "yarn", "factor": 2.0, "original_length": 30})
    assert extrapolation_policies(["riflex"], wan, 161, 81, (480, 832))[1:] == [None, None]
    assert extrapolation_policies(["riflex"], wan, 81, 81, (480, 832)) == [None, None, None]  # not longer
    _, dype_rows, _ = extrapolation_policies(["dype", "riflex"], wan, 81, 81, (480, 832))
    assert dype_rows.dynamic and dype_rows.policy(60, sigma=0.0) == make_policy(None)
    with pytest.raises(ValueError, match="choose one of"):
        extrapolation_policies(["ntk", "yarn"], wan, 81, 81, (480, 832))


@pytest.mark.parametrize("frames,train,expected", [("2x", None, 33), ("2x", 81, 161), ("1.5x", 9, 13), ("21", 9, 21)])
def test_frames_as_a_multiple_of_the_trained_length(frames, train, expected):
    import argparse

    from mmpos.pipelines.commands.generate.video import _frame_count

    assert _frame_count(frames, train or 17, True, argparse.ArgumentParser()) == expected


def test_twice_the_length_and_size_with_riflex_and_dype_from_the_command(tmp_path, capsys):
    from PIL import Image

    """At the trained length and size every preset is the stock pipeline bit for bit (same frames); at 2x
    frames (RIFLEx) and 2x rows (DyPE) the video has the requested shape and differs."""
    trained = [
        "--model",
        "tiny",
        "--train-frames",
        "5",
        "--train-size",
        "16x32",
        "--height",
        "16",
        "--width",
        "32",
        "--steps",
        "2",
    ]
    for name, extra in (("stock", []), ("dype_1x", ["--extrapolate", "dype", "riflex"])):
        assert main(["generate", "video", "--out", str(tmp_path / name), "--frames", "1x", *trained, *extra]) == 0
    assert np.array_equal(read_video(tmp_path / "stock/video.mp4"), read_video(tmp_path / "dype_1x/video.mp4"))
    grids = [np.asarray(Image.open(tmp_path / name / "frames.png")) for name in ("stock", "dype_1x")]
    assert np.array_equal(*grids)  # lossless
    capsys.readouterr()
    big = [*trained[:6], "--height", "32", "--width", "32", "--steps", "2", "--frames", "2x"]
    for name, extra in (("stock_2x", []), ("dype_2x", ["--extrapolate", "riflex", "dype"])):
        assert main(["generate", "video", "--out", str(tmp_path / name), *big, *extra]) == 0
    printed = capsys.readouterr().out
    assert "'type': 'riflex', 'k': 1, 'target_length': 3" in printed and "'dynamic': True" in printed
    stock, dype = read_video(tmp_path / "stock_2x/video.mp4"), read_video(tmp_path / "dype_2x/video.mp4")
    assert dype.shape == (9, 32, 32, 3) and not np.array_equal(stock, dype)


def test_ntk_extrapolation_runs_from_the_command(tmp_path, capsys):
    out = tmp_path / "ntk"
    assert (
        main(
            ["generate", "video", "--out", str(out), "--extrapolate", "ntk", "riflex", "--train-size", "16x32", *SMALL]
        )
        == 0
    )
    assert "'method': 'ntk', 'original_length': 1.0" in capsys.readouterr().out  # rows: 32 px against 16 trained
    assert (out / "video.mp4").is_file()
