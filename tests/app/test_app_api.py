"""Every endpoint of ``mmpos app`` called through gradio_client against the running page (embedded world models,
CPU, 2 denoising steps): outputs are the command line's own, bad input arrives as the command's named error."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from PIL import Image

from .conftest import gradio  # noqa: F401  (skips the module without the [app] extra)

STEPS = 2


@pytest.fixture(scope="module")
def client(served_app):
    from gradio_client import Client

    return Client(served_app[0], verbose=False)


def _pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.float64)


def _files(result) -> dict:
    """Downloads (a gr.File list) by file name."""
    return {path.rsplit("/", 1)[-1]: path for path in result}


def test_generate_extrapolated_beside_plain_equals_the_command_line(client, tmp_path):
    from gradio_client import handle_file  # noqa: F401

    from mmpos.pipelines.commands import main

    extrapolated, plain, downloads = client.predict("", 64, 64, "dype", 0, STEPS, api_name="/generate")
    files = _files(downloads)
    assert sorted(files) == ["config.yaml", "image_0.png", "image_0_no_extrapolation.png"]  # one name each
    config = yaml.safe_load(open(files["config.yaml"]))
    assert config["extrapolate"]["preset"] == "dype" and config["sampler"]["height"] == 64
    assert _pixels(extrapolated).shape == _pixels(plain).shape == (64, 64, 3)
    assert np.abs(_pixels(extrapolated) - _pixels(plain)).mean() > 1.0  # DyPE changes the 2x-size image
    # the same command typed on the command line writes the same image, bit for bit
    argv = ["generate", "--model", "world", "--height", "64", "--width", "64", "--extrapolate", "dype"]
    argv += ["--set", f"sampler.num_inference_steps={STEPS}", "--set", "seed=0", "--out", str(tmp_path / "cli")]
    assert main(argv) == 0
    assert np.array_equal(_pixels(tmp_path / "cli" / "image_0.png"), _pixels(extrapolated))


def test_generate_unknown_word_is_the_commands_error(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match=r"mmpos generate: error: .*outside the world's vocabulary: \['elephant'\]"):
        client.predict("a purple elephant", 64, 64, "dype", 0, STEPS, api_name="/generate")


def test_edit_band_with_a_reference_photo_follows_the_strength(client, pictures):
    from gradio_client import handle_file

    targets = "a large gray square at center\na large yellow hexagon at right"
    runs = {
        s: client.predict(handle_file(str(pictures["background"])), "", targets, s, STEPS, 0, "", api_name="/edit_band")
        for s in (0.0, 1.0)
    }
    for strength, (edited, comparison, downloads) in runs.items():
        assert len(edited) == 2  # one image per target
        files = _files(downloads)
        assert {"comparison.png", "config.yaml", "edited_0.png", "edited_1.png"} <= set(files)
        config = yaml.safe_load(open(files["config.yaml"]))
        assert config["band"]["strength"] == strength and config["reference"]["image"]
        assert _pixels(comparison).shape[1] > 3 * 32  # the strip: inputs, edited, sweep
    first = [_pixels(runs[s][0][0]["image"]) for s in (0.0, 1.0)]
    assert np.abs(first[0] - first[1]).mean() > 0.5  # the slider's strength changes the edit


def test_edit_transplant_box_and_its_errors(client, pictures):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    background, reference = handle_file(str(pictures["background"])), handle_file(str(pictures["object"]))
    edited, comparison, downloads = client.predict(
        background, reference, 8, 8, 40, 32, 0.85, STEPS, 0, "", api_name="/edit_transplant"
    )
    files = _files(downloads)
    config = yaml.safe_load(open(files["config.yaml"]))
    assert config["transplant"]["tau"] == 0.85
    assert _pixels(edited[0]["image"]).shape[:2] == (27, 32)  # the 48 x 40 picture fitted into 32 px, padding cropped
    assert _pixels(files["edited_0_fullsize.png"]).shape[:2] == (40, 48)  # and at the input file's size
    with pytest.raises(AppError, match=r"mmpos edit transplant: error: .*box"):
        client.predict(background, reference, 8, 8, 400, 32, 0.85, STEPS, 0, "", api_name="/edit_transplant")
    with pytest.raises(AppError, match=r"--reference: upload"):
        client.predict(background, None, 8, 8, 40, 32, 0.85, STEPS, 0, "", api_name="/edit_transplant")


def test_edit_loose(client, pictures):
    from gradio_client import handle_file

    edited, comparison, downloads = client.predict(
        handle_file(str(pictures["collage"])),
        handle_file(str(pictures["background"])),
        1.0,
        STEPS,
        0,
        "",
        api_name="/edit_loose",
    )
    assert len(edited) == 1 and "comparison.png" in _files(downloads)
    assert yaml.safe_load(open(_files(downloads)["config.yaml"]))["loose"]["strength"] == 1.0


def test_camera_rig_then_video_from_actions(client):
    import cv2

    rig = client.predict("actions", "", "forward 0.4; turn 20; strafe -0.2", 9, api_name="/plot_rig")
    assert _pixels(rig).std() > 1  # a drawn figure
    rig, video, frames, numbers, downloads = client.predict(
        "actions", "", "forward 0.4; turn 20; strafe -0.2", 9, STEPS, 0, "ucpe", 1.0, api_name="/camera_video"
    )
    capture = cv2.VideoCapture(video if isinstance(video, str) else video["video"])
    fourcc = int(capture.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode()
    count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    capture.release()
    assert fourcc.lower() in ("avc1", "h264", "vp09", "vp90")  # H.264 or VP9: browsers play them (not mp4v)
    assert count == 9
    assert numbers["frame"] == list(range(1, 9)) and len(numbers["rot_err"]) == 8
    assert "trajectory.json" in _files(downloads)
    with pytest.raises(Exception, match=r"mmpos generate video: error: --camera: actions: 'jump 3'"):
        client.predict("actions", "", "jump 3", 9, api_name="/plot_rig")


def test_encoding_figure_and_bad_options(client):
    from gradio_client.exceptions import AppError

    figure = client.predict("rope_axial", 64, '{"theta": 100}', 31, api_name="/encoding")
    assert _pixels(figure).shape[1] >= 800
    with pytest.raises(AppError, match=r"options: rope_axial takes no option\(s\) \['thetaa'\]"):
        client.predict("rope_axial", 64, json.dumps({"thetaa": 1}), 31, api_name="/encoding")


def test_cancel_stops_a_long_clip_mid_denoising_and_frees_the_page(client, served_app):
    """A 300-step clip cancelled once its denoising loop has advanced: the job ends as "cancelled" without
    writing its clip, and the next job runs (the page's one command slot is free again)."""
    import time

    from gradio_client.exceptions import AppError

    root = served_app[1]
    before = set(root.iterdir())
    job = client.submit("actions", "", "forward 0.4", 9, 300, 0, "ucpe", 1.0, api_name="/camera_video")
    deadline = time.monotonic() + 300
    while not _denoising_advanced(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _denoising_advanced(job), "the clip's denoising never reported progress"
    client.predict(api_name="/cancel")
    with pytest.raises(AppError, match="cancelled: the job was stopped before it finished"):
        job.result(timeout=120)
    assert client.predict("actions", "", "forward 0.4", 9, STEPS, 0, "ucpe", 1.0, api_name="/camera_video")
    cancelled_runs = sorted(set(root.iterdir()) - before)[:2]  # the cancelled job's camera path and clip folders
    assert not [p for run in cancelled_runs for p in run.rglob("*.mp4")], cancelled_runs


def _denoising_advanced(job) -> bool:
    """True once the job's progress shows a tqdm loop (the denoising steps) past its first few steps."""
    progress = job.status().progress_data or []
    return any(unit.length and unit.length >= 300 and (unit.index or 0) >= 3 for unit in progress)
