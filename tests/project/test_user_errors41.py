"""Issue 41, user inputs: photos read as a viewer shows them (every bit, upright), sizes checked against the model
before anything is allocated, bounded command-line numbers, unwritable or full outputs: one line naming the
argument or file (exit code 2), never a traceback or an error from inside torch or diffusers."""

from __future__ import annotations

import errno
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import FluxFillPipeline  # noqa: F401  (imported here: torchao's import-time warnings are not a command's stderr)
from PIL import Image, ImageOps

from mmpos.pipelines.commands import main
from mmpos.pipelines.images import _oriented, as_image_batch, as_mask, read_photo
from tests.project.test_user_errors35 import _one_line_exit_2

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
WORLD_VIDEO = ROOT / "assets" / "world-video" / "model_index.json"


def _png(path, array) -> str:
    Image.fromarray(array).save(path)
    return str(path)


# ----- photos: full depth ------------------------------------------------------------------------------------------


def test_a_16_bit_grey_png_is_scaled_by_65535_not_clipped_to_white(tmp_path):
    grey = np.arange(40 * 40, dtype=np.uint16).reshape(40, 40) * 40  # 0 .. 63960
    photo = read_photo(_png(tmp_path / "grey16.png", grey))
    assert photo.shape == (40, 40, 3) and photo.dtype == np.float32
    np.testing.assert_allclose(photo[..., 1], grey / 65535.0, rtol=0, atol=1e-7)  # was: min(v, 255) / 255
    assert photo.max() < 0.98 and np.unique(photo).size == grey.size  # every level kept, none at white
    clipped = np.asarray(Image.open(tmp_path / "grey16.png").convert("RGB"))  # what PIL alone gives
    assert (clipped == 255).mean() > 0.99


def test_a_16_bit_colour_png_keeps_all_16_bits(tmp_path):
    import cv2

    rgb = np.random.default_rng(0).integers(0, 65536, (24, 32, 3), dtype=np.uint16)
    cv2.imwrite(str(tmp_path / "rgb16.png"), rgb[..., ::-1])  # OpenCV writes BGR
    photo = read_photo(tmp_path / "rgb16.png")
    np.testing.assert_allclose(photo, rgb / 65535.0, rtol=0, atol=1e-7)
    eight_bit = np.asarray(Image.open(tmp_path / "rgb16.png").convert("RGB")) / 255.0  # PIL: 8 bits of 16
    assert np.abs(eight_bit - rgb / 65535.0).max() > 1e-3  # the precision read_photo keeps and PIL drops


def test_pil_images_given_to_the_library_keep_their_depth():
    deep = Image.fromarray(np.full((8, 8), 30000, np.uint16))
    assert torch.allclose(as_image_batch("image", deep), torch.full((1, 3, 8, 8), 30000 / 65535))
    levels = np.full((8, 8), 20000, np.uint16)  # 0.31 of full scale: not selected (was: >= 255, selected)
    levels[:, :3] = 40000  # 0.61: selected
    expected = torch.zeros(8, 8, dtype=torch.bool)
    expected[:, :3] = True
    assert torch.equal(as_mask("mask", Image.fromarray(levels)), expected)


# ----- photos: EXIF orientation -----------------------------------------------------------------------------------


def _with_orientation(array, orientation: int, path) -> str:
    image = Image.fromarray(array)
    exif = image.getexif()
    exif[0x0112] = orientation
    image.save(path, exif=exif)
    return str(path)


def test_a_portrait_phone_photo_stands_up(tmp_path):
    stored = np.zeros((40, 64, 3), np.uint8)  # landscape as stored by the sensor
    stored[:8, :8] = 255  # a marker at the stored top-left
    photo = read_photo(_with_orientation(stored, 6, tmp_path / "portrait.png"))  # 6: rotate 90 clockwise to show
    assert photo.shape == (64, 40, 3)  # portrait, as every viewer shows it (was: 40 x 64, lying on its side)
    assert photo[:8, -8:].min() == 1.0 and photo[-8:, :8].max() == 0.0  # the marker is now at the top-right


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_matches_pil(tmp_path, orientation):
    stored = np.random.default_rng(orientation).integers(0, 256, (20, 28, 3), dtype=np.uint8)
    path = _with_orientation(stored, orientation, tmp_path / "o.png")
    expected = np.asarray(ImageOps.exif_transpose(Image.open(path)).convert("RGB")) / 255.0
    np.testing.assert_allclose(read_photo(path), expected, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(_oriented(stored, orientation), (expected * 255).round())  # the 16-bit path's


def test_an_upright_box_is_checked_against_the_shown_size(tmp_path, capsys):
    """A --box inside the shown (rotated) portrait background is inside: the size is the upright one."""
    from mmpos.pipelines.edits.transplant.cli import image_height_width

    path = _with_orientation(np.zeros((40, 64, 3), np.uint8), 6, tmp_path / "portrait.png")
    assert image_height_width(path) == (64, 40)


# ----- photos: too small, unreadable -----------------------------------------------------------------------------


def test_a_photo_below_the_minimum_is_refused_naming_the_option(tmp_path, capsys):
    small = _png(tmp_path / "small.png", np.full((10, 10, 3), 90, np.uint8))
    reference = _png(tmp_path / "ref.png", np.full((40, 40, 3), 90, np.uint8))
    argv = ["edit", "transplant", "--model", "world", "--background", small, "--reference", reference]
    line = _one_line_exit_2(capsys, [*argv, "--box", "1", "1", "5", "5", "--out", str(tmp_path / "o")])
    assert "--background" in line and "small.png is 10x10" in line and "at least 16" in line
    assert not (tmp_path / "o").exists()


def test_a_photo_that_is_not_an_image_is_one_line(tmp_path):
    (tmp_path / "notes.png").write_text("not an image")
    with pytest.raises(ValueError, match=r"^--image .*notes.png: cannot be read as an image"):
        read_photo(tmp_path / "notes.png", "--image")
    with pytest.raises(ValueError, match=r"^--image .*missing.png: no such file"):
        read_photo(tmp_path / "missing.png", "--image")


def test_a_30_pixel_background_is_resized_saying_so_in_one_line(tmp_path, capsys):
    small = _png(tmp_path / "s30.png", np.full((30, 30, 3), 90, np.uint8))
    argv = ["edit", "transplant", "--model", "world", "--background", small, "--reference", small]
    argv += ["--box", "1", "1", "20", "20", "--set", "sampler.num_inference_steps=1", "--no-figures"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "background: resized 30x30 to 32x32 (the world model's size)" in out


@pytest.mark.skipif(not WORLD_VIDEO.is_file(), reason="no world video model")
def test_generate_video_image_too_small_or_unreadable(tmp_path, capsys):
    small = _png(tmp_path / "small.png", np.full((8, 8, 3), 90, np.uint8))
    base = ["generate", "video", "--model", "world", "--out", str(tmp_path / "o")]
    _one_line_exit_2(capsys, [*base, "--image", small], "--image", "8x8", "at least 16")
    (tmp_path / "text.png").write_text("no")
    _one_line_exit_2(capsys, [*base, "--image", str(tmp_path / "text.png")], "--image", "cannot be read")


# ----- mmpos generate: sizes and sampler counts -------------------------------------------------------------------


def _no_sampling(monkeypatch):
    from diffusers import FluxPipeline

    def refuse(*args, **kwargs):
        raise AssertionError("the pipeline ran before the size was checked")

    monkeypatch.setattr(FluxPipeline, "__call__", refuse)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--height", "7"], ["--height 7 (sampler.height)", "multiple of 4 pixels"]),
        (["--width", "30"], ["--width 30 (sampler.width)", "multiple of 4 pixels", "e.g. 28"]),
        (["--height", "100000"], ["--height 100000", "3125x the model's training size 32", "at most 16x"]),
        (["--set", "sampler.num_inference_steps=0"], ["sampler.num_inference_steps=0", "positive integer"]),
        (["--set", "sampler.num_inference_steps=many"], ["sampler.num_inference_steps='many'"]),
        (["--set", "sampler.height=-32"], ["--height -32 (sampler.height)", "positive integer"]),
    ],
)
def test_generate_sizes_and_steps(tmp_path, capsys, monkeypatch, argv, named):
    _no_sampling(monkeypatch)
    _one_line_exit_2(capsys, ["generate", "--model", "world", *argv, "--out", str(tmp_path / "o")], *named)
    assert not (tmp_path / "o").exists()


def test_generate_size_that_does_not_fit_in_memory_is_refused_with_the_estimate(tmp_path, capsys, monkeypatch):
    from mmpos.pipelines import images

    _no_sampling(monkeypatch)
    monkeypatch.setattr(images, "available_bytes", lambda device: 2**20)  # 1 MiB free
    argv = ["generate", "--model", "world", "--height", "512", "--width", "512", "--out", str(tmp_path / "o")]
    line = _one_line_exit_2(capsys, argv, "--height 512", "--width 512", "GiB", "1 image(s) of 512x512")
    needed = float(line.split("need at least ")[1].split(" GiB")[0])
    assert needed > 0.0 and "0.0 GiB free" in line


def test_generation_estimate_grows_with_the_pixels():
    from types import SimpleNamespace

    from mmpos.pipelines.images import generation_bytes

    pipe = SimpleNamespace(
        vae=SimpleNamespace(config={"block_out_channels": [128, 256]}, dtype=torch.bfloat16),
        transformer=SimpleNamespace(
            config=SimpleNamespace(num_attention_heads=24, attention_head_dim=128), dtype=torch.bfloat16
        ),
        vae_scale_factor=8,
    )
    # FLUX.1 at 100000 x 1024: the VAE's full-size block alone, 3 maps of 128 channels in bf16
    assert generation_bytes(pipe, 100000, 1024, 1) == 3 * 100000 * 1024 * 128 * 2
    assert generation_bytes(pipe, 2048, 2048, 2) == 4 * generation_bytes(pipe, 1024, 2048, 1)


# ----- outputs: unwritable places, a full disk ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--model", "world"],
        ["world", "clip", "--frames", "2"],
        ["viz", "cameras", "preset:orbit"],
        ["world", "render", "--shape", "circle", "--colour", "red", "--box", "1", "1", "5", "5"],
        ["world", "dataset", "--count", "1"],
    ],
)
def test_out_under_proc_is_one_line_before_any_work(capsys, argv):
    if not Path("/proc").is_dir():
        pytest.skip("no /proc")
    _one_line_exit_2(capsys, [*argv, "--out", "/proc/mmpos-test/out"], "--out /proc/mmpos-test/out", "/proc")


def test_out_below_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("mine")
    _one_line_exit_2(
        capsys, ["world", "clip", "--out", str(tmp_path / "file" / "c")], "--out", f"{tmp_path / 'file'} is a file"
    )
    assert (tmp_path / "file").read_text() == "mine"


def test_a_full_disk_while_writing_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    def full(self, fp, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", full)
    out = tmp_path / "o"
    argv = ["generate", "--model", "world", "--set", "sampler.num_inference_steps=1", "--out", str(out)]
    line = _one_line_exit_2(capsys, argv, "No space left on device")
    assert f"cannot write {out / 'image_0.png'}:" in line  # the file the user asked for, not the temporary one
    assert not any(out.glob("*.partial*")) and not (out / "image_0.png").exists()


# ----- --prompt-embeds files ---------------------------------------------------------------------------------------


class _Runs:
    def __reduce__(self):
        return (print, ("code from a --prompt-embeds file ran",))


@pytest.fixture(scope="module")
def tiny_flux_folder(tmp_path_factory):
    from diffusers import FluxPipeline

    from tests.fixtures.tiny_models import components

    folder = tmp_path_factory.mktemp("flux") / "flux"
    FluxPipeline(**components("flux")).save_pretrained(folder)
    return folder


def _embeds_files(tmp_path) -> dict:
    from safetensors.torch import save_file

    from tests.fixtures.tiny_models import embeddings

    good = embeddings(1)
    (tmp_path / "garbage.safetensors").write_bytes(b"\x00\x01 not safetensors at all")
    (tmp_path / "garbage.pt").write_bytes(b"garbage, not a torch file")
    (tmp_path / "code.pt").write_bytes(pickle.dumps({"prompt_embeds": _Runs()}))
    torch.save([1, 2], tmp_path / "list.pt")
    save_file(
        {"prompt_embeds": good["prompt_embeds"][0], "pooled_prompt_embeds": good["pooled_prompt_embeds"]},
        str(tmp_path / "flat.safetensors"),
    )
    save_file(
        {"prompt_embeds": good["prompt_embeds"], "pooled_prompt_embeds": good["pooled_prompt_embeds"][:, :5]},
        str(tmp_path / "width.safetensors"),
    )
    two = embeddings(2)
    save_file(
        {"prompt_embeds": two["prompt_embeds"], "pooled_prompt_embeds": good["pooled_prompt_embeds"]},
        str(tmp_path / "batch.safetensors"),
    )
    save_file({"prompt_embeds": good["prompt_embeds"]}, str(tmp_path / "half.safetensors"))
    return {
        "garbage.safetensors": "cannot be read",
        "garbage.pt": "expected a safetensors or .pt file of tensors",
        "code.pt": "refused",
        "list.pt": "holds a list; expected a dict of tensors",
        "flat.safetensors": "prompt_embeds has shape (6, 32); expected [B, L, D]",
        "width.safetensors": "pooled_prompt_embeds has shape (1, 5); expected width D",
        "batch.safetensors": "differ in the batch size",
        "half.safetensors": "lacks ['pooled_prompt_embeds']",
        "missing.pt": "no such file",
    }


def test_bad_prompt_embeds_files_are_one_line(tmp_path, capsys, tiny_flux_folder):
    cases = _embeds_files(tmp_path)
    base = ["generate", "--model", str(tiny_flux_folder), "--device", "cpu", "--dtype", "float32"]
    base += ["--set", "sampler.height=32", "--set", "sampler.width=32", "--set", "sampler.num_inference_steps=1"]
    for name, expected in cases.items():
        line = _one_line_exit_2(
            capsys, [*base, "--prompt-embeds", str(tmp_path / name), "--out", str(tmp_path / "o")], "--prompt-embeds"
        )
        assert name in line and expected in line, (name, line)
        assert "code from a --prompt-embeds file ran" not in capsys.readouterr().out
    assert not (tmp_path / "o").exists()


def test_generate_video_out_under_proc_names_the_command(capsys):
    if not Path("/proc").is_dir():
        pytest.skip("no /proc")
    _one_line_exit_2(capsys, ["generate", "video", "--model", "tiny", "--out", "/proc/x/y"], "--out /proc/x/y")


def test_the_benchmark_s_argument_errors_are_one_line(capsys):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_rotary.py"), "--repeats", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--repeats" in lines[0], done.stderr  # was: the usage block


# ----- model folders, ViT configs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("contents", ['{"_class_name": "FluxPipeline", ', "[1, 2]"])
@pytest.mark.parametrize("command", [["generate"], ["edit", "loose"]])
def test_a_malformed_model_index_is_one_line(tmp_path, capsys, command, contents):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model_index.json").write_text(contents)  # was: JSONDecodeError / AttributeError tracebacks
    image = _png(tmp_path / "i.png", np.full((32, 32, 3), 90, np.uint8))
    extra = ["--image", image, "--original", image] if command[0] == "edit" else []
    argv = [*command, "--model", str(folder), "--device", "cpu", *extra, "--out", str(tmp_path / "o")]
    _one_line_exit_2(capsys, argv, str(folder), "model_index.json")


def test_a_misspelt_pe_option_in_a_vit_config_names_the_key_and_the_valid_ones(tmp_path, capsys):
    from mmpos.training import ViTConfig
    from mmpos.training.scaffold.config import ConfigError
    from mmpos.training.tasks.vit import check_names

    with pytest.raises(ConfigError, match=r"pe_options: unknown key\(s\) \['thetaa'\] .*'theta'"):
        check_names(ViTConfig(pe="rope_axial", pe_options={"thetaa": 100}))
    check_names(ViTConfig(pe="rope_axial", pe_options={"theta": 100, "grid_mode": "index"}))  # encoding's, convert's
    (tmp_path / "vit.yaml").write_text(json.dumps({"pe": "rope_axial", "pe_options": {"thetaa": 100}}))
    argv = ["train", "vit", "--config", str(tmp_path / "vit.yaml"), "--output-dir", str(tmp_path / "run")]
    _one_line_exit_2(capsys, argv, "pe_options", "thetaa", "theta")


# ----- bounded numbers: viz cameras, world clip, the camera adapter trainer ----------------------------------------


@pytest.mark.parametrize(
    "argv, named",
    [
        (["viz", "cameras", "preset:orbit", "--model", "unified", "--fov", "0"], ["--fov", "(0, 360)"]),
        (["viz", "cameras", "preset:orbit", "--model", "unified", "--fov", "400"], ["--fov", "(0, 360)"]),
        (["viz", "cameras", "preset:orbit", "--fov", "400"], ["--fov", "(0, 360)"]),
        (["viz", "cameras", "preset:orbit", "--fov", "90"], ["--fov / --xi", "--model unified"]),  # was: ignored
        (["viz", "cameras", "preset:orbit", "--model", "unified", "--fov", "200"], ["fov_degrees=200", "xi=0"]),
        (["world", "clip", "--objects", "100000"], ["--objects", "[0, 64]"]),
        (["world", "clip", "--objects", "-1"], ["--objects", "[0, 64]"]),
        (["world", "clip", "--scale", "nan"], ["--scale", "finite"]),
        (["world", "clip", "--scale", "inf"], ["--scale", "finite"]),
        (["world", "clip", "--scale", "0"], ["--scale", "(0, 100]"]),
        (["world", "clip", "--fov", "180"], ["--fov", "(0, 180)"]),
        (["world", "clip", "--degrees", "nan"], ["--degrees", "finite"]),
        (["world", "render", "--size", "100000"], ["--size", "[1, 2048]"]),
        (["demo", "--image-size", "100000"], ["--image-size", "[1, 4096]"]),  # was: numpy MemoryError
        (["generate", "video", "--model", "tiny", "--height", "100000"], ["--height 100000", "1562x", "16x"]),
        (["generate", "video", "--model", "tiny", "--frames", "100001"], ["--frames 100001", "at most 16x"]),
    ],
)
def test_bounded_numbers(tmp_path, capsys, argv, named):
    _one_line_exit_2(capsys, [*argv, "--out", str(tmp_path / "o")], *named)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "extra, named",
    [(["--frames", "6"], ["--frames", "4k + 1"]), (["--height", "20"], ["--height", "multiple of 16"])],
)
def test_train_camera_adapter_frames_and_sizes(tmp_path, capsys, extra, named):
    from tests.training.test_train_camera_adapter import load_script

    argv = ["--data", str(tmp_path), "--out", str(tmp_path / "run"), "--steps", "1", *extra]
    _one_line_exit_2(capsys, argv, *named, runner=load_script().main)
    assert not (tmp_path / "run").exists()
