"""`mmpos generate video --model world` says whether the clip follows its camera (issue 46 item 2): the verdict
on rendered ground truth (follows) and on a still camera (does not), and the command's motions comparison."""

import json

import numpy as np
import pytest

from mmpos.cli import main
from mmpos.eval.video_eval import eval_clips
from mmpos.pipelines.video.following import describe_following, following

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def clips():
    return eval_clips(1)  # one held-out scene filmed along orbit, dolly and pan (the renders: the truth)


def test_rendered_motions_follow_and_a_still_camera_does_not(clips):
    for clip in clips:
        rendered = following(clip.truth.astype(np.float64) / 255, clip.trajectory)
        still = following(np.repeat(clip.truth[:1], len(clip.truth), 0).astype(np.float64) / 255, clip.trajectory)
        assert rendered["follows"], (clip.motion, rendered)
        assert not still["follows"], (clip.motion, still)
        assert "does NOT follow" in describe_following(clip.motion.kind, still)


def test_compare_motions_prints_each_verdict_and_writes_the_figure(tmp_path, capsys):
    out = tmp_path / "video"
    assert main(["generate", "video", "--model", "world", "--steps", "2", "--compare-motions", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    measured = json.loads((out / "following.json").read_text())
    assert list(measured) == ["orbit:35", "dolly:1", "pan:20"]
    for motion, values in measured.items():
        verdict = "follows" if values["follows"] else "does NOT follow"
        assert f"camera following of {motion}: " in printed and f"the model {verdict} it" in printed
    assert (out / "motions.png").is_file()
