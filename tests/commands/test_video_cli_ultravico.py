"""``mmpos generate video --extrapolate ultravico``: the stock video at the trained length, a different one past it
(composed with RIFLEx), a bad ``--ultravico-alpha`` refused in one line."""

import numpy as np
import pytest

from mmpos.cli import main


def read_video(path):
    import cv2

    capture, frames = cv2.VideoCapture(str(path)), []
    while (frame := capture.read())[0]:
        frames.append(frame[1])
    return np.stack(frames)


TRAINED = ["--model", "tiny", "--train-frames", "5", "--height", "16", "--width", "32", "--steps", "2"]


def test_stock_at_the_trained_length_and_a_change_past_it(tmp_path, capsys):
    runs = {
        "stock": ["--frames", "1x"],
        "ultravico_1x": ["--frames", "1x", "--extrapolate", "ultravico"],
        "riflex_2x": ["--frames", "2x", "--extrapolate", "riflex"],
        "both_2x": ["--frames", "2x", "--extrapolate", "riflex", "ultravico", "--ultravico-alpha", "0.5"],
    }
    for name, extra in runs.items():
        assert main(["generate", "video", "--out", str(tmp_path / name), *TRAINED, *extra]) == 0
    assert "'train_frames': 2, 'alpha': 0.5" in capsys.readouterr().out
    videos = {name: read_video(tmp_path / name / "video.mp4") for name in runs}
    assert np.array_equal(videos["stock"], videos["ultravico_1x"])
    assert videos["both_2x"].shape == videos["riflex_2x"].shape == (9, 16, 32, 3)
    assert np.abs(videos["both_2x"].astype(int) - videos["riflex_2x"].astype(int)).max() > 0


def test_a_bad_alpha_is_one_line(tmp_path, capsys):
    args = ["generate", "video", "--out", str(tmp_path / "bad"), *TRAINED, "--frames", "2x"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--extrapolate", "ultravico", "--ultravico-alpha", "1.5"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "alpha must be in (0, 1]" in err and "Traceback" not in err
