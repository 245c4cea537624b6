"""A clip folder (:mod:`mmpos.training.camera_clips`) pairs every frame with one pose: a folder whose frame count and
pose count differ is refused naming both counts and the pose file (issue 41: 12 frames and 4 poses were accepted)."""

import numpy as np
import pytest
from PIL import Image

from mmpos.camera import preset_trajectory, save_trajectory
from mmpos.training.camera_clips import find_clips, read_clip


def clip_folder(folder, frames: int):
    folder.mkdir(parents=True)
    for i in range(frames):
        Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(folder / f"frame_{i:03d}.png")
    return folder


def realestate_lines(poses: int) -> str:
    """A RealEstate10K pose file: a URL line, then ``timestamp fx fy cx cy 0 0`` and a 3x4 world-to-camera row."""
    rows = [f"{i * 33366} 0.5 0.9 0.5 0.5 0 0 1 0 0 {0.1 * i} 0 1 0 0 0 0 1 0" for i in range(poses)]
    return "\n".join(["https://www.youtube.com/watch?v=example", *rows]) + "\n"


@pytest.mark.parametrize("pose_file", ["trajectory.json", "cameras.txt"])
def test_a_clip_with_fewer_poses_than_frames_is_refused_naming_both(tmp_path, pose_file):
    folder = clip_folder(tmp_path / "data" / "clip_a", 12)
    if pose_file == "trajectory.json":
        save_trajectory(preset_trajectory("orbit", 4), folder / pose_file)
    else:
        (folder / pose_file).write_text(realestate_lines(4))
    with pytest.raises(ValueError, match=f"clip .*clip_a: 12 frames but 4 poses in {pose_file}"):
        read_clip(folder)
    with pytest.raises(ValueError, match="12 frames but 4 poses"):
        find_clips(tmp_path / "data")


def test_a_clip_with_one_pose_per_frame_is_read(tmp_path):
    folder = clip_folder(tmp_path / "clip_b", 4)
    (folder / "cameras.txt").write_text(realestate_lines(4))
    clip = read_clip(folder)
    assert len(clip.frames) == len(clip.trajectory) == 4
    assert clip.trajectory.c2w[:, 0, 3].tolist() == pytest.approx([0.0, -0.1, -0.2, -0.3])  # the inverse of w2c
