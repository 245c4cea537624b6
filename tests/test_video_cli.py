"""``mmpos generate video`` on the tiny offline Wan components."""
import numpy as np
import pytest

from mmpos.cli import main
from mmpos.integrations.diffusers.camera_adapter import CameraAdapter
from mmpos.pipelines.tiny_wan import tiny_wan_transformer
from mmpos.pipelines.video_cli import extrapolation_policies, riflex_k

SMALL = ["--frames", "9", "--height", "32", "--width", "48", "--steps", "2"]


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
    assert sorted(p.name for p in out.iterdir()) == ["frames.png", "rig.png", "video.mp4"]  # no temporary left


def test_image_to_video_with_an_adapter_and_riflex(tmp_path, capsys):
    from PIL import Image

    adapter = CameraAdapter.for_transformer(tiny_wan_transformer(image_to_video=True), "ucpe", head_dim=16)
    adapter.save_pretrained(tmp_path / "adapter")
    Image.fromarray(np.full((40, 60, 3), 128, np.uint8)).save(tmp_path / "first.png")
    out = tmp_path / "i2v"
    assert main(["generate", "video", "--out", str(out), "--image", str(tmp_path / "first.png"), "--adapter",
                 str(tmp_path / "adapter"), "--extrapolate", "riflex", *SMALL]) == 0
    printed = capsys.readouterr().out
    assert "camera adapter: ucpe" in printed and "'type': 'riflex'" in printed
    assert read_video(out / "video.mp4").shape == (9, 32, 48, 3)


@pytest.mark.parametrize("bad,message", [(["--frames", "10"], "4k + 1"), (["--height", "40"], "multiple of 16"),
                                         (["--camera", "nowhere.txt"], "--camera nowhere.txt")])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, bad, message):
    with pytest.raises(SystemExit) as error:
        main(["generate", "video", "--out", str(tmp_path / "x"), *SMALL, *bad])
    assert error.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x" / "video.mp4").exists()


def test_riflex_picks_the_time_pair_whose_period_is_closest_to_the_trained_length():
    from diffusers import WanTransformer3DModel

    wan13b_head = WanTransformer3DModel(num_attention_heads=1, attention_head_dim=128, in_channels=4, out_channels=4,
                                        text_dim=16, ffn_dim=8, num_layers=1)  # Wan2.1-1.3B's head: 44 time channels
    # periods 2 pi 10000^(2j/44): 6.3, 9.5, 14.5, 22.1, 33.7, ...: 21 latent frames (81 video frames) -> pair 4
    assert riflex_k(wan13b_head, 21) == 4
    assert riflex_k(wan13b_head, 30) == 5
    assert riflex_k(tiny_wan_transformer(), 21) == 1  # tiny: 4 time channels, periods 6.3 and 628


def test_extrapolation_policies_per_axis():
    wan = tiny_wan_transformer()
    policies = extrapolation_policies(["riflex", "ntk"], wan, 161, (480, 1664), 81, (480, 832))
    assert policies == [{"type": "riflex", "k": 1, "target_length": 41}, None, {"type": "ntk", "factor": 2.0}]
    yarn = extrapolation_policies(["yarn"], wan, 81, (960, 832), 81, (480, 832))
    assert yarn == [None, {"type": "yarn", "factor": 2.0, "original_length": 30}, None]
    with pytest.raises(ValueError, match="ntk or yarn"):
        extrapolation_policies(["ntk", "yarn"], wan, 81, (960, 832), 81, (480, 832))


def test_ntk_extrapolation_runs_from_the_command(tmp_path, capsys):
    out = tmp_path / "ntk"
    assert main(["generate", "video", "--out", str(out), "--extrapolate", "ntk", "riflex", "--train-size", "16x32",
                 *SMALL]) == 0
    assert "'type': 'ntk', 'factor': 2.0" in capsys.readouterr().out  # rows: 32 px against 16 trained
    assert (out / "video.mp4").is_file()
