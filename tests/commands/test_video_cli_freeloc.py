"""``mmpos generate video --extrapolate freeloc``: the stock video at the trained length, a different one past it
(composed with RIFLEx), two attention rules at once refused in one line."""

import numpy as np
import pytest

from mmpos.cli import main
from tests.commands.test_video_cli_ultravico import TRAINED, read_video


def test_stock_at_the_trained_length_and_a_change_past_it(tmp_path, capsys):
    runs = {
        "stock": ["--frames", "1x"],
        "freeloc_1x": ["--frames", "1x", "--extrapolate", "freeloc"],
        "riflex_3x": ["--frames", "3x", "--extrapolate", "riflex"],
        "both_3x": ["--frames", "3x", "--extrapolate", "riflex", "freeloc"],
    }
    for name, extra in runs.items():
        assert main(["generate", "video", "--out", str(tmp_path / name), *TRAINED, *extra]) == 0
    assert "{'type': 'freeloc', 'train_frames': 2}" in capsys.readouterr().out
    videos = {name: read_video(tmp_path / name / "video.mp4") for name in runs}
    assert np.array_equal(videos["stock"], videos["freeloc_1x"])
    assert videos["both_3x"].shape == videos["riflex_3x"].shape == (13, 16, 32, 3)
    assert np.abs(videos["both_3x"].astype(int) - videos["riflex_3x"].astype(int)).max() > 0


def test_two_rules_are_one_line(tmp_path, capsys):
    args = ["generate", "video", "--out", str(tmp_path / "bad"), *TRAINED, "--frames", "2x"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--extrapolate", "ultravico", "freeloc"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "choose one attention rule of ultravico, freeloc" in err and "Traceback" not in err
