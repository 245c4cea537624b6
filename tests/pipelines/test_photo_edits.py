"""A photograph through `mmpos edit` / `mmpos generate` on the shipped world models (issue 31 item 1): the run says
what the world models cannot do before it loads one, keeps the photo's aspect (padded, never squashed), maps
boxes and masks given in the photo's pixels through the same padding, writes the output cropped back and at the
photo's size, prints the prompt it used, and a word outside the world's vocabulary is one line naming the words
it knows."""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from PIL import Image

from mmpos.cli import main
from mmpos.pipelines.placement import fit_square, on_token_grid
from mmpos.world.vocabulary import check_known_words, world_vocabulary
from tests.fixtures.photos import photo_like, save_photo

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
FAST = ["--set", "sampler.num_inference_steps=1", "--set", "figure.sweep=[]", "--no-figures"]
KNOWN = world_vocabulary()[2:]  # after <pad> and <s>


def config_value(name: str, *keys):
    value = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
    for key in keys:
        value = value[key]
    return value


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A 600x400 photo (JPEG), a red object, and a collage: the photo with the object pasted, and its mask."""
    root = tmp_path_factory.mktemp("photos")
    save_photo(root / "photo.jpg")
    obj = np.full((60, 80, 3), 255, np.uint8)
    obj[10:50, 10:70] = (220, 30, 30)
    Image.fromarray(obj).save(root / "obj.png")
    collage, mask = photo_like(), np.zeros((400, 600), np.uint8)
    collage[150:250, 250:370], mask[150:250, 250:370] = (220, 30, 30), 255
    Image.fromarray(collage).save(root / "collage.png")
    Image.fromarray(mask).save(root / "mask.png")
    return root


# -- the placement: aspect kept, boxes and masks through the padding, the way back -----------------------------


def test_a_landscape_or_portrait_photo_is_fitted_centred_not_squashed():
    wide = fit_square((400, 600), 32)  # 32 * 400 / 600 = 21.33 rows -> 21; (32 - 21) // 2 = 5 above, 6 below
    assert (wide.content, wide.offset, wide.canvas, wide.padding) == ((21, 32), (5, 0), (32, 32), (0, 0, 5, 6))
    tall = fit_square((600, 400), 32)
    assert (tall.content, tall.offset, tall.padding) == ((32, 21), (0, 5), (5, 6, 0, 0))
    square = fit_square((64, 64), 32)
    assert (square.content, square.padding) == ((32, 32), (0, 0, 0, 0)) and square.changed
    with pytest.raises(ValueError, match="expected positive sizes"):
        fit_square((0, 600), 32)


def test_a_box_and_a_mask_in_photo_pixels_map_exactly_through_the_padding():
    placement = fit_square((480, 640), 32)  # scale 1/20: 24 x 32 content, 4 rows of padding above
    assert placement.offset == (4, 0)
    box = (100, 60, 300, 260)  # / 20 = (5, 3, 15, 13), rows shifted by the 4 padding rows
    assert placement.place_box(box) == (5, 7, 15, 17)
    mask = torch.zeros(480, 640, dtype=torch.bool)
    mask[60:260, 100:300] = True
    placed = placement.place_mask(mask)
    rows, cols = placed.any(1).nonzero().flatten(), placed.any(0).nonzero().flatten()
    assert placed.shape == (32, 32) and int(placed.sum()) == 10 * 10
    assert (int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1) == (5, 7, 15, 17)
    with pytest.raises(ValueError, match="--box 0 0 700 10: expected left < right <= 640"):
        placement.place_box((0, 0, 700, 10))


def test_the_placed_image_is_the_resized_photo_padded_with_its_edges_and_crops_back_to_it():
    photo = torch.from_numpy(photo_like()).permute(2, 0, 1)[None].double() / 255
    placement = fit_square((400, 600), 32)
    placed = placement.place_image(photo)
    resized = F.interpolate(photo, size=(21, 32), mode="bilinear", antialias=True, align_corners=False).clamp(0, 1)
    assert placed.shape == (1, 3, 32, 32)
    assert torch.equal(placed[..., 5:26, :], resized) and torch.equal(placement.crop(placed), resized)
    assert torch.equal(placed[..., :5, :], resized[..., :1, :].expand(-1, -1, 5, -1))  # edge rows repeated
    assert torch.equal(placed[..., 26:, :], resized[..., -1:, :].expand(-1, -1, 6, -1))
    assert placement.to_source(placed[0]).shape == (3, 400, 600)


def test_the_crop_scales_with_an_output_larger_than_the_input():
    placement = fit_square((400, 600), 32)
    rows = torch.arange(64.0)[:, None].expand(64, 64)  # a 2x output covering the same view: rows 10..51
    cropped = placement.crop(rows[None])
    assert cropped.shape == (1, 42, 64) and cropped[0, 0, 0] == 10 and cropped[0, -1, 0] == 51


def test_on_the_token_grid_nothing_is_padded():
    placement = on_token_grid((400, 600), 16)
    assert (placement.content, placement.canvas, placement.padding) == ((400, 592), (400, 592), (0, 0, 0, 0))
    assert not on_token_grid((32, 48), 16).changed


def test_a_word_outside_the_vocabulary_names_the_nearest_and_every_known_word_in_one_line():
    with pytest.raises(ValueError) as raised:
        check_known_words(["a red circle", "a red zebra circel"], world_vocabulary())
    message = str(raised.value)
    assert "\n" not in message and message.startswith("captions[1] 'a red zebra circel' has words outside")
    assert "['circel', 'zebra']" in message and "'circel' -> 'circle'" in message
    assert message.endswith(f"the world models know only these {len(KNOWN)} words: {' '.join(KNOWN)}")


# -- the command line on a photo -------------------------------------------------------------------------------


def run_cli(argv, capsys):
    assert main(argv) == 0
    return capsys.readouterr().out


def lines_with(printed: str, start: str) -> list[str]:
    return [line for line in printed.splitlines() if line.startswith(start)]


def test_transplant_on_a_photo_warns_keeps_the_aspect_and_writes_the_photo_size(photos, tmp_path, capsys):
    out = tmp_path / "transplant"
    argv = ["edit", "transplant", "--model", "world", "--background", str(photos / "photo.jpg")]
    argv += ["--reference", str(photos / "obj.png"), "--box", "200", "120", "360", "280", "--out", str(out), *FAST]
    printed = run_cli(argv, capsys)
    (notice,) = lines_with(printed, "note: the world models")
    assert "32 px synthetic" in notice and "photographs are outside what they know" in notice
    assert "mmpos edit transplant --model black-forest-labs/FLUX.1-Fill-dev --device cuda" in notice
    assert printed.index(notice) < printed.index("model: ")  # said before the model loads
    assert "background: 400x600 fitted into the 32x32 model input as 21x32, aspect kept" in printed
    # x * 32 / 600 and y * 21 / 400 rounded outwards, rows + 5 padding: 10.7 -> 10, 6.3 + 5 -> 11, 19.2 -> 20, 14.7 + 5 -> 20
    assert "--box 200 120 360 280 of the 400x600 background is 10 11 20 20 of the 32x32 model input" in printed
    default = config_value("edit_transplant_world", "prompt")
    assert lines_with(printed, "prompt used: ") == [f'prompt used: "{default}" (the config\'s; --prompt sets it)']
    edited = np.asarray(Image.open(out / "edited_0.png").convert("RGB"), dtype=np.float64) / 255
    assert edited.shape == (21, 32, 3)  # the photo's region of the model output, padding cropped off
    assert Image.open(out / "edited_0_fullsize.png").size == (600, 400)
    # outside the repainted box (10 11 20 20 of the input, a token around it) the output is the photo, resized to
    # 21 x 32 with its aspect: pixel for pixel, so the picture was neither squashed nor shifted by the padding
    photo = torch.from_numpy(np.asarray(Image.open(photos / "photo.jpg"), dtype=np.float64) / 255)
    resized = F.interpolate(photo.permute(2, 0, 1)[None], size=(21, 32), mode="bilinear", antialias=True)
    keep = np.ones((21, 32), bool)
    keep[11 - 5 - 5 : 20 + 5 - 5, 10 - 5 : 20 + 5] = False  # rows of the input minus the 5 padding rows
    difference = np.abs(edited - resized[0].permute(1, 2, 0).numpy())
    assert difference[keep].max() <= 1 / 255 + 1e-9 and keep.sum() > 150
    assert difference[~keep].max() > 0.1  # the box was repainted


def test_loose_on_a_photo_collage_maps_its_mask_and_writes_the_photo_size(photos, tmp_path, capsys):
    out = tmp_path / "loose"
    argv = ["edit", "loose", "--model", "world", "--image", str(photos / "collage.png")]
    argv += ["--mask", str(photos / "mask.png"), "--out", str(out), *FAST]
    printed = run_cli(argv, capsys)
    assert "mmpos edit loose --model black-forest-labs/FLUX.1-Kontext-dev --device cuda" in printed
    assert "image: 400x600 fitted into the 32x32 model input as 21x32, aspect kept" in printed
    assert f'"{config_value("edit_loose_world", "prompt")}" (the config\'s; --prompt sets it)' in printed
    assert Image.open(out / "edited_0.png").size == (32, 21)
    assert Image.open(out / "edited_0_fullsize.png").size == (600, 400)


def test_band_kontext_on_a_photo_and_band_prompts_say_where_they_come_from(photos, tmp_path, capsys):
    out = tmp_path / "band_kontext"
    argv = ["edit", "band", "--model", "world", "--set", "variant=kontext", "--image", str(photos / "photo.jpg")]
    printed = run_cli([*argv, "--prompt", "make the background striped", "--out", str(out), *FAST], capsys)
    assert "mmpos edit band --model black-forest-labs/FLUX.1-Kontext-dev" in printed
    assert 'prompt used: "make the background striped" (from --prompt)' in printed
    assert Image.open(out / "edited_0_fullsize.png").size == (600, 400)
    argv = ["edit", "band", "--model", "world", "--target", "a large blue square at center"]
    printed = run_cli([*argv, "--out", str(tmp_path / "band"), *FAST], capsys)
    assert "mmpos edit band --model black-forest-labs/FLUX.1-dev --device cuda" in printed
    reference = config_value("edit_band_world", "reference", "prompt")
    (line,) = lines_with(printed, "prompts used: ")
    assert line == (
        f'prompts used: reference "{reference}" (the config\'s; --reference-prompt sets it); '
        'targets "a large blue square at center" (from --target)'
    )
    assert not (tmp_path / "band" / "edited_0_fullsize.png").exists()  # new images: no input to go back to


@pytest.mark.parametrize(
    "argv",
    [
        ["edit", "transplant", "--background", "PHOTO", "--reference", "OBJ", "--box", "200", "120", "360", "280"],
        ["generate"],
    ],
    ids=["edit", "generate"],
)
def test_a_photo_prompt_is_one_line_listing_the_words_the_world_knows(argv, photos, tmp_path, capsys):
    argv = [str(photos / "photo.jpg") if a == "PHOTO" else str(photos / "obj.png") if a == "OBJ" else a for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--model", "world", "--prompt", "a photo of a cat on a sofa", "--out", str(tmp_path / "o")])
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]  # (the lines before: the loading progress bar)
    assert exit_info.value.code == 2 and captured.err.count("error:") == 1 and "Traceback" not in captured.err
    assert re.search(
        r"error: captions\[0\] 'a photo of a cat on a sofa' has words .*\['cat', 'of', 'photo', 'sofa'\]", last
    )
    assert last.endswith(" ".join(KNOWN))
    assert 'prompt used: "a photo of a cat on a sofa" (from --prompt)' in captured.out
    assert not (tmp_path / "o").exists()


def test_generate_on_the_world_model_says_what_it_is_and_the_prompt_it_used(tmp_path, capsys):
    printed = run_cli(
        ["generate", "--model", "world", "--out", str(tmp_path), "--set", "sampler.num_inference_steps=1"], capsys
    )
    assert "mmpos generate --model black-forest-labs/FLUX.1-dev --device cuda" in printed
    assert "they draw only such scenes (32 px toy previews, never photographs)" in printed
    assert printed.index("note: the world models") < printed.index("model: ")
    prompts = config_value("generate_world", "prompts")
    assert f'prompt used: "{prompts[0]}" (the config\'s; --prompt sets it)' in printed


def test_the_readme_walks_a_new_user_through_a_photo_edit_on_the_world_model():
    """The README has a shell block that edits a photo (not a 64 px test image) on the world model and is not
    skipped: tests/project/test_documentation.py runs it on the fixture photo (``tests/fixtures/photos.py``)."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"(?:^(<!-- doc-test: [^\n]*-->)\n)?^```bash\n(.*?)^```", text, flags=re.M | re.S)
    runs = [code for marker, code in blocks if not re.match(r"<!-- doc-test: (skip|setup)", marker)]
    commands = [line for code in runs for line in code.splitlines() if line.startswith("mmpos edit ")]
    assert any("--model world" in c and "--background photo.jpg" in c for c in commands), commands
