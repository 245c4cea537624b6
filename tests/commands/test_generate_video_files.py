"""Video outputs one can look at (issue 31, item 7): H.264 where this OpenCV build has it (else a named fallback
in one line), a GIF beside the mp4, ``frames.png`` upscaled nearest-neighbour with frame labels, and one line for
every resize of ``--image``, every resampling of poses to frames and more frames than trained; with a motion
the world model was not trained on (item 5) on both model paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmpos.cli import main
from mmpos.pipelines.commands.generate import video_files as video_outputs
from mmpos.pipelines.commands.generate.video_files import CODECS, VIEWABLE_PIXELS, frame_grid, write_gif, write_mp4


def palette_video(frames=5, height=16, width=24) -> torch.Tensor:
    """``[F, 3, H, W]`` of four flat colours in quadrants that move per frame (exact in a GIF palette)."""
    colours = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, 1.0]])
    video = torch.empty(frames, 3, height, width)
    for f in range(frames):
        for q in range(4):
            rows = slice(0, height // 2) if q < 2 else slice(height // 2, height)
            cols = slice(0, width // 2) if q % 2 == 0 else slice(width // 2, width)
            video[f, :, rows, cols] = colours[(q + f) % 4, :, None, None]
    return video


READ_BACK = {"avc1": {"avc1", "h264"}, "vp09": {"vp09", "vp90"}, "mp4v": {"mp4v", "fmp4"}}  # as FFmpeg names them


def fourcc_of(path) -> tuple[str, int]:
    """The stream's codec tag as the decoder reports it, and the number of frames decoded."""
    import cv2

    capture = cv2.VideoCapture(str(path))
    code = int(capture.get(cv2.CAP_PROP_FOURCC))
    count = 0
    while capture.read()[0]:
        count += 1
    return "".join(chr((code >> 8 * i) & 0xFF) for i in range(4)).lower(), count


def test_mp4_is_the_first_codec_this_build_opens_and_a_fallback_says_so(tmp_path, monkeypatch):
    import cv2

    opened = []
    for fourcc, _ in CODECS:
        with video_outputs._quiet_native_stderr():
            writer = cv2.VideoWriter(
                str(tmp_path / f"probe-{fourcc}.mp4"), cv2.VideoWriter_fourcc(*fourcc), 8.0, (24, 16)
            )
        opened.append(writer.isOpened())
        writer.release()
    notes = []
    write_mp4(palette_video(), tmp_path / "v.mp4", 8, log=notes.append)
    first = CODECS[opened.index(True)][0]
    tag, count = fourcc_of(tmp_path / "v.mp4")
    assert tag in READ_BACK[first] and count == 5
    assert len(notes) == int(first != "avc1")
    if notes:
        assert notes[0].startswith(f"v.mp4: this OpenCV build has no H.264 (avc1) encoder; wrote {first}")
    # with the middle codec gone, a build without avc1 falls back to mp4v and says that it does not play in browsers
    monkeypatch.setattr(video_outputs, "CODECS", (CODECS[0], CODECS[2]))
    notes.clear()
    write_mp4(palette_video(), tmp_path / "w.mp4", 8, log=notes.append)
    if not opened[0]:
        tag, count = fourcc_of(tmp_path / "w.mp4")
        assert tag in READ_BACK["mp4v"] and count == 5 and "browsers do not play" in notes[0]


def test_gif_has_every_frame_upscaled_nearest_neighbour(tmp_path):
    from PIL import Image, ImageSequence

    video = palette_video()
    write_gif(video, tmp_path / "v.gif", fps=8)
    gif = Image.open(tmp_path / "v.gif")
    factor = -(-VIEWABLE_PIXELS // 16)
    assert gif.size == (24 * factor, 16 * factor) and gif.n_frames == 5 and gif.info["loop"] == 0
    expected = video_outputs.video_to_uint8(video)
    for index, frame in enumerate(ImageSequence.Iterator(gif)):
        pixels = np.asarray(frame.convert("RGB"))
        assert np.array_equal(pixels[::factor, ::factor], expected[index])  # one block per pixel ...
        assert np.array_equal(pixels, expected[index].repeat(factor, 0).repeat(factor, 1))  # ... every pixel of it


def test_frame_grid_tiles_are_upscaled_and_labelled():
    video = palette_video(frames=9)
    grid = frame_grid(video, count=4, columns=2)
    factor = -(-VIEWABLE_PIXELS // 16)
    tile_h, tile_w = 16 * factor, 24 * factor
    label = grid.shape[0] // 2 - tile_h
    assert grid.shape == (2 * (label + tile_h), 2 * tile_w, 3) and label > 0
    expected = video_outputs.video_to_uint8(video)
    strips = []
    for slot, index in enumerate((0, 3, 5, 8)):  # evenly spaced picks of 9 frames
        r, c = divmod(slot, 2)
        top = r * (label + tile_h)
        tile = grid[top + label : top + label + tile_h, c * tile_w : (c + 1) * tile_w]
        assert np.array_equal(tile, expected[index].repeat(factor, 0).repeat(factor, 1))
        strip = grid[top : top + label, c * tile_w : (c + 1) * tile_w]
        assert (strip < 128).any()  # text drawn
        strips.append(strip.tobytes())
    assert len(set(strips)) == 4  # each label differs ("frame i / 9")


def test_tiny_wan_reports_resize_resampling_and_length(tmp_path, capsys):
    from PIL import Image

    from mmpos.camera import preset_trajectory, write_re10k
    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter
    from mmpos.models.tiny_wan import tiny_wan_transformer

    CameraAdapter.for_transformer(tiny_wan_transformer(image_to_video=True), "ucpe", head_dim=16).save_pretrained(
        tmp_path / "adapter"
    )
    Image.fromarray(np.full((40, 60, 3), 90, np.uint8)).save(tmp_path / "first.png")
    write_re10k(preset_trajectory("arc", 17), tmp_path / "poses.txt")
    small = [
        "--model",
        "tiny",
        "--height",
        "32",
        "--width",
        "32",
        "--steps",
        "1",
        "--train-frames",
        "5",
        "--image",
        str(tmp_path / "first.png"),
        "--adapter",
        str(tmp_path / "adapter"),
    ]
    assert (
        main(
            [
                "generate",
                "video",
                *small,
                "--frames",
                "9",
                "--camera",
                str(tmp_path / "poses.txt"),
                "--out",
                str(tmp_path / "a"),
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert f"--image {tmp_path / 'first.png'}: resized 60x40 -> 32x32 (the model's size, aspect changed)" in lines
    assert [line for line in lines if "resampled" in line] == [
        f"--camera {tmp_path / 'poses.txt'}: 17 poses resampled to 9 frames (geodesic rotations, linear centres)"
    ]
    assert [line for line in lines if line.startswith("warning: --frames")] == [
        "warning: --frames 9 is more than the 5 frames the model was trained on; expect repeats or drift past them "
        "(--extrapolate riflex adapts the time axis)"
    ]
    assert {p.name for p in (tmp_path / "a").iterdir()} == {"video.mp4", "video.gif", "frames.png", "rig.png"}
    assert (
        main(["generate", "video", *small, "--frames", "5", "--camera", "zoom_out", "--out", str(tmp_path / "b")]) == 0
    )  # an old name, steering through the adapter
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if "resampled" in line or line.startswith("warning:")]


def test_world_video_model_runs_an_untrained_motion_and_reports(tmp_path, capsys):
    from PIL import Image

    from mmpos.pipelines.commands.generate.world_video import world_model_folder

    if world_model_folder("world") is None:
        pytest.skip("assets/world-video is not in this checkout")
    Image.fromarray(np.full((48, 64, 3), 200, np.uint8)).save(tmp_path / "first.png")
    assert (
        main(
            [
                "generate",
                "video",
                "--model",
                "world",
                "--camera",
                "tilt:10",
                "--frames",
                "10",
                "--steps",
                "1",
                "--image",
                str(tmp_path / "first.png"),
                "--out",
                str(tmp_path / "w"),
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert (
        "camera: the world video model was trained on orbit, dolly and pan only; running tilt:10 anyway "
        "(expect the video to follow it loosely)" in lines
    )
    assert (
        "warning: --frames 10 is more than the 9 frames the model was trained on; expect the camera to be "
        "followed loosely past them" in lines
    )
    assert any(line.startswith("--image ") and "resized 64x48 -> 32x32" in line for line in lines)
    assert fourcc_of(tmp_path / "w" / "video.mp4")[1] == 10 and (tmp_path / "w" / "video.gif").is_file()
