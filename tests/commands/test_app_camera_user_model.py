"""The app's Camera video tab on a model other than the world's (``mmpos app --model FOLDER``), through its
Gradio-free workflow: here the offline ``tiny`` Wan components; the adapter is a folder, empty for none."""

from __future__ import annotations

import pytest

from mmpos.pipelines.commands.app.runs import CommandError
from mmpos.pipelines.commands.app.workflows import Workspace, camera_video

pytestmark = pytest.mark.usefixtures("one_thread")


def test_camera_clip_on_a_wan_pipeline_without_an_adapter(tmp_path):
    import cv2

    result = camera_video(Workspace(tmp_path, "tiny"), "orbit:35", 5, 1, 0, "", 1.0)
    capture = cv2.VideoCapture(str(result.video))
    count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    capture.release()
    assert count == 5 and result.following["frame"] == [1, 2, 3, 4]
    assert "camera adapter: none (pass --adapter)" in result.log  # said, not silently unsteered


def test_an_adapter_folder_that_is_not_there_is_the_commands_error(tmp_path):
    with pytest.raises(CommandError, match=r"mmpos generate video: error: --adapter .*missing-adapter"):
        camera_video(Workspace(tmp_path, "tiny"), "orbit:35", 5, 1, 0, str(tmp_path / "missing-adapter"), 1.0)
