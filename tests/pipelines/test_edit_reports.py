"""What `mmpos edit` reports about its own effect (issue 46 items 1 and 3), on the world models and real
photographs (scikit-image's sample photos): band modulation shows the reference photo itself, does not condition
it on the config's unrelated prompt and measures how much it moved the targets; transplant says how much it
repainted around the requested box and outlines both on the comparison figure."""

import json

import numpy as np
import pytest
from PIL import Image

from mmpos.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")
skimage_data = pytest.importorskip("skimage.data")  # the sample photographs ship with the package

STEPS = ["--set", "sampler.num_inference_steps=4", "--set", "figure.sweep=[]"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    for name in ("chelsea", "coffee"):  # 300x451 cat, 400x600 cup: landscape photos, padded into 32x32
        Image.fromarray(getattr(skimage_data, name)()).save(root / f"{name}.png")
    return root


@pytest.fixture
def figure_inputs(monkeypatch):
    """The panels and outlines the command hands to the comparison figure."""
    import mmpos.pipelines.edits.figures as figures

    seen, draw = {}, figures.comparison_figure

    def record(inputs, edited, sweep, path, title="", overlays=None):
        seen.update(inputs=inputs, overlays=overlays)
        return draw(inputs, edited, sweep, path, title, overlays)

    monkeypatch.setattr(figures, "comparison_figure", record)
    return seen


def test_band_with_a_photo_shows_it_uses_no_unrelated_prompt_and_measures_its_effect(
    photos, tmp_path, capsys, figure_inputs
):
    out = tmp_path / "band"
    argv = ["edit", "band", "--model", "world", "--reference-image", str(photos / "chelsea.png")]
    assert main([*argv, "--out", str(out), *STEPS]) == 0
    printed = capsys.readouterr().out
    assert "reference prompt: empty (a reference image is given" in printed
    assert 'prompts used: reference "" (the config\'s' in printed
    assert "reference image: 300x451 fitted into the 32x32 model input" in printed
    assert "cropped back" not in printed and not list(out.glob("*fullsize*"))  # band writes 32x32 targets only
    # the first panel is the photo: its mean colour is the photo's (padding repeats edge pixels: within 6/255)
    inputs = figure_inputs["inputs"]
    assert list(inputs) == ["reference photo", "reference branch (reconstruction)"]
    photo = np.asarray(Image.open(photos / "chelsea.png"), dtype=np.float64) / 255
    shown = inputs["reference photo"].double().permute(1, 2, 0).numpy()
    assert shown.shape == (32, 32, 3)
    assert np.abs(shown[5:26].mean((0, 1)) - photo.mean((0, 1))).max() < 6 / 255
    assert (out / "comparison.png").is_file()
    effect = json.loads((out / "summary.json").read_text())["reference_effect"]
    assert len(effect["mean_abs_change_255"]) == 2 and min(effect["mean_abs_change_255"]) > 5  # visibly moved
    assert "the reference image moved the targets by" in printed


@pytest.mark.parametrize("margin", [0, 1])
def test_transplant_reports_the_repainted_area_against_the_box_and_outlines_both(
    margin, photos, tmp_path, capsys, figure_inputs
):
    out = tmp_path / "transplant"
    argv = ["edit", "transplant", "--model", "world", "--background", str(photos / "coffee.png")]
    argv += ["--reference", str(photos / "chelsea.png"), "--box", "200", "120", "360", "280"]
    argv += ["--set", f"transplant.mask_dilate_tokens={margin}", "--out", str(out), *STEPS]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    # 400x600 into 32x32: x * 32 / 600, y * 21 / 400 rounded out, rows + 5 padding -> 10 11 20 20: 10 x 9 pixels
    assert "is 10 11 20 20 of the 32x32 model input" in printed
    area = json.loads((out / "summary.json").read_text())["repainted"]
    assert area["requested_pixels"] == 90 and area["margin_tokens"] == margin
    requested, repainted = (mask for mask, _, _ in figure_inputs["overlays"]["background"])
    assert int(requested.sum()) == 90 and int(repainted.sum()) == area["repainted_pixels"]
    assert bool(repainted[requested].all())  # the whole request is repainted
    outside = area["repainted_pixels"] - 90
    assert outside == area["outside_request_pixels"]
    side = area["margin_pixels"]
    rows, cols = repainted.any(1).nonzero().flatten(), repainted.any(0).nonzero().flatten()
    # the margin: at most `side` pixels beyond the box on every side, rounded out to whole tokens
    assert int(cols[0]) >= 10 - side - 1 and int(cols[-1]) + 1 <= 20 + side + 1
    assert int(rows[0]) >= 11 - side - 1 and int(rows[-1]) + 1 <= 20 + side + 1
    if margin == 0:
        assert area["ratio"] <= 1.5  # the box, rounded out to tokens
    else:
        assert area["ratio"] > 1.5 and f"repainted {area['repainted_pixels']} px" in printed
    assert (out / "comparison.png").is_file()
