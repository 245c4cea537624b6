"""`mmpos edit` / `mmpos generate` on the shipped world models: `--model world`, the no-CUDA default, `--box`."""

import json

import numpy as np
import pytest
from PIL import Image

from mmpos.cli import build_parser, main
from mmpos.pipelines.inputs import rescale_box

FAST = ["--set", "sampler.num_inference_steps=2", "--set", "figure.sweep=[0.0]"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A 64x64 background, a 48x40 reference object, a collage and its paste mask (the user's own sizes)."""
    root = tmp_path_factory.mktemp("user_images")
    background = np.full((64, 64, 3), (250, 250, 200), dtype=np.uint8)
    Image.fromarray(background).save(root / "my.png")
    reference = np.full((40, 48, 3), 255, dtype=np.uint8)
    reference[8:32, 8:40] = (220, 30, 30)
    Image.fromarray(reference).save(root / "obj.png")
    collage, mask = background.copy(), np.zeros((64, 64), dtype=np.uint8)
    collage[8:40, 8:40], mask[8:40, 8:40] = (220, 30, 30), 255
    Image.fromarray(collage).save(root / "collage.png")
    Image.fromarray(mask).save(root / "mask.png")
    return root


def written_names(printed: str) -> set[str]:
    lines = printed.split("wrote ", 1)[1].splitlines()
    assert lines[0].startswith(f"{len(lines) - 1} files to")
    return {line.strip() for line in lines[1:]}


def test_transplant_with_a_box_runs_on_the_world_fill_model(images, tmp_path, capsys):
    out = tmp_path / "transplant"
    assert (
        main(
            [
                "edit",
                "transplant",
                "--model",
                "world",
                "--background",
                str(images / "my.png"),
                "--reference",
                str(images / "obj.png"),
                "--box",
                "8",
                "8",
                "40",
                "40",
                "--out",
                str(out),
                *FAST,
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "(PosBridgeFillPipeline), device cpu, dtype float32" in printed
    assert "--box 8 8 40 40 of the 64x64 background is 4 4 20 20 of the 32x32 model input" in printed
    assert Image.open(out / "edited_0.png").size == (32, 32)
    assert written_names(printed) == {p.name for p in out.iterdir()}  # exactly the files it wrote
    assert json.loads((out / "summary.json").read_text())["method"] == "transplant"


def test_band_and_loose_run_on_the_world_models_with_prompt_strings(images, tmp_path, capsys):
    assert (
        main(
            [
                "edit",
                "band",
                "--model",
                "world",
                "--target",
                "a large blue square at center",
                "--out",
                str(tmp_path / "band"),
                *FAST,
            ]
        )
        == 0
    )
    assert Image.open(tmp_path / "band" / "edited_0.png").size == (32, 32)
    assert (
        main(
            [
                "edit",
                "loose",
                "--model",
                "world",
                "--image",
                str(images / "collage.png"),
                "--mask",
                str(images / "mask.png"),
                "--out",
                str(tmp_path / "loose"),
                *FAST,
            ]
        )
        == 0
    )
    assert Image.open(tmp_path / "loose" / "edited_0.png").size == (32, 32)
    assert "(LooseRoPEKontextPipeline)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:  # a word the world model does not know: one line
        main(["edit", "band", "--model", "world", "--target", "a red zebra", "--out", str(tmp_path / "zebra"), *FAST])
    err = capsys.readouterr().err  # (the lines before: the loading progress bar)
    assert exit_info.value.code == 2 and "['zebra']" in err.strip().splitlines()[-1] and err.count("error:") == 1


def test_without_cuda_and_without_model_generate_uses_the_world_model(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "generate"
    assert (
        main(
            [
                "generate",
                "--prompt",
                "a small blue circle at top left",
                "--out",
                str(out),
                "--set",
                "sampler.num_inference_steps=2",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "no CUDA GPU: running the shipped world models" in printed
    assert "world-t2i (FluxPipeline), device cpu, dtype float32" in printed
    assert Image.open(out / "image_0.png").size == (32, 32)
    assert written_names(printed) == {"image_0.png", "config.yaml"}


def test_a_folder_without_model_index_is_one_line_naming_what_is_expected(images, tmp_path, capsys):
    folder = tmp_path / "not_a_pipeline"
    (folder / "transformer").mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "edit",
                "transplant",
                "--model",
                str(folder),
                "--background",
                str(images / "my.png"),
                "--reference",
                str(images / "obj.png"),
                "--box",
                "8",
                "8",
                "40",
                "40",
                "--out",
                str(tmp_path / "o"),
            ]
        )
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "no model_index.json there; expected a diffusers pipeline folder" in err


def test_box_is_four_integers_in_edit_and_world_render():
    edit = build_parser().parse_args(
        ["edit", "transplant", "--background", "b.png", "--reference", "r.png", "--box", "8", "8", "40", "40"]
    )
    render = build_parser().parse_args(
        ["world", "render", "--shape", "star", "--colour", "red", "--out", "x.png", "--box", "8", "8", "40", "40"]
    )
    assert edit.box == render.box == [8, 8, 40, 40]


def test_a_comma_box_is_refused_naming_the_argument(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(
            ["edit", "transplant", "--background", "b.png", "--reference", "r.png", "--box", "8,8,40,40"]
        )
    assert exit_info.value.code == 2 and "--box" in capsys.readouterr().err


def test_rescale_box_rounds_outwards_and_refuses_a_box_outside_the_image():
    assert rescale_box((8, 8, 40, 40), (64, 64), (32, 32)) == (4, 4, 20, 20)
    assert rescale_box((1, 3, 7, 9), (50, 30), (32, 32)) == (1, 1, 8, 6)  # floor of 1.07, 1.92; ceil of 7.47, 5.76
    with pytest.raises(ValueError, match="--box 8 8 70 40: expected left < right <= 64"):
        rescale_box((8, 8, 70, 40), (64, 64), (32, 32))


def test_a_box_outside_the_background_fails_before_the_model_loads(images, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "edit",
                "transplant",
                "--model",
                "world",
                "--background",
                str(images / "my.png"),
                "--reference",
                str(images / "obj.png"),
                "--box",
                "8",
                "8",
                "80",
                "40",
                "--out",
                str(tmp_path / "o"),
            ]
        )
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and "--box 8 8 80 40: expected left < right <= 64" in captured.err
    assert "model:" not in captured.out and not (tmp_path / "o").exists()
