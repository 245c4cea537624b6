"""The mini-world: determinism per seed, ground truth against pixels, edit pairs, datasets, bad input."""

import json

import numpy as np
import pytest

from mmpos.world import COLOURS, ObjectSpec, SceneSpec, SceneStyle, render_scene, sample_scene
from mmpos.world.data import WorldDataset, build_arrays, write_image_folder
from mmpos.world.edit_pairs import harmonise_pair, instruction_pair, style_set, transplant_pair
from mmpos.world.render import SHADE, mask_box

SEEDS = range(12)


def on_colour_segment(pixels: np.ndarray, colour: str) -> np.ndarray:
    """Whether each pixel [N, 3] is ``c + w (SHADE c - c)`` for some w in [0, 1], to rounding."""
    base = np.array(COLOURS[colour], dtype=np.float64)
    direction = base * SHADE - base
    w = np.clip((pixels - base) @ direction / (direction @ direction), 0.0, 1.0)
    return np.abs(pixels - (base + w[:, None] * direction)).max(axis=1) <= 1.0


@pytest.mark.parametrize("seed", [0, 7])
def test_same_seed_same_scene_and_pixels(seed):
    a, b = render_scene(sample_scene(seed)), render_scene(sample_scene(seed))
    assert a.spec == b.spec and np.array_equal(a.image, b.image) and np.array_equal(a.masks, b.masks)
    assert sample_scene(seed) != sample_scene(seed + 1)


def test_ground_truth_matches_pixels():
    for seed in SEEDS:
        rendered = render_scene(sample_scene(seed))
        image = rendered.image.reshape(-1, 3).astype(np.float64)
        covered = np.zeros(image.shape[0], dtype=bool)
        for obj, mask in zip(rendered.spec.objects, rendered.masks):
            flat = mask.reshape(-1)
            assert flat.any(), f"seed {seed}: {obj.shape} left no visible pixel"
            assert on_colour_segment(image[flat], obj.colour).all(), f"seed {seed}: {obj.colour} mask"
            assert not (covered & flat).any(), "visible masks must not overlap"
            covered |= flat
            x0, y0, x1, y1 = mask_box(mask)
            bx0, by0, bx1, by1 = obj.box
            assert bx0 <= x0 and by0 <= y0 and x1 <= bx1 and y1 <= by1
        assert on_colour_segment(image[~covered], rendered.spec.style.background).all()


def test_caption_names_every_object():
    spec = sample_scene(3)
    caption = spec.caption()
    for obj in spec.objects:
        assert f"{obj.colour} {obj.shape}" in caption
    assert spec.style.background in caption
    assert all(w not in spec.caption(include_style=False) for w in ("background", "striped", "dotted", "plain"))


def test_spec_round_trips_through_dict():
    spec = sample_scene(5)
    assert SceneSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(shape="blob"), "shape='blob'"),
        (dict(colour="teal"), "colour='teal'"),
        (dict(box=(10, 10, 5, 20)), "box="),
        (dict(box=(50, 50, 70, 60)), "inside the 64x64"),
        (dict(box=(1, 1, 3, 3)), "too small"),
    ],
)
def test_bad_object_is_a_clear_error(kwargs, words):
    obj = dict(shape="star", colour="red", box=(4, 4, 20, 20), **{})
    obj.update(kwargs)
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        SceneSpec(64, SceneStyle(), (ObjectSpec(**obj),))


def test_bad_style_and_background_clash():
    with pytest.raises(ValueError, match="object_pattern='plaid'"):
        SceneStyle("white", "flat", "plaid")
    with pytest.raises(ValueError, match="equals the background"):
        SceneSpec(64, SceneStyle("red"), (ObjectSpec("star", "red", (4, 4, 20, 20)),))


def test_transplant_changes_only_the_box():
    for seed in SEEDS:
        pair = transplant_pair(seed)
        x0, y0, x1, y1 = pair.box
        outside = np.ones(pair.mask.shape, dtype=bool)
        outside[y0:y1, x0:x1] = False
        assert np.array_equal(pair.target.image[outside], pair.background.image[outside])
        assert pair.mask.any() and not (pair.mask & outside).any()
        obj = pair.target.spec.objects[-1]
        assert obj.box == pair.box and pair.reference.spec.objects[0].shape == obj.shape
        assert on_colour_segment(pair.target.image[pair.mask].astype(float), obj.colour).all()


def test_transplant_rejects_an_impossible_box():
    with pytest.raises(ValueError, match="box="):
        transplant_pair(0, box=(60, 60, 80, 80))


def test_harmonise_pair_ground_truth():
    for seed in SEEDS:
        pair = harmonise_pair(seed)
        scene = pair.scene.image
        assert np.array_equal(pair.collage[~pair.paste_mask], scene[~pair.paste_mask])
        assert np.array_equal(pair.target.image[~pair.object_mask], scene[~pair.object_mask])
        assert not np.array_equal(pair.collage[pair.paste_mask], pair.target.image[pair.paste_mask])
        assert pair.source.spec.style.object_pattern != pair.target.spec.style.object_pattern
        assert (pair.object_mask <= pair.paste_mask).all()


def test_style_set_shares_the_reference_style_not_its_layout():
    styles = style_set(4, count=3)
    for target, prompt in zip(styles.targets, styles.prompts):
        assert target.spec.style == styles.reference.spec.style
        assert target.spec.objects != styles.reference.spec.objects
        assert prompt == target.spec.caption(include_style=False)


def test_instruction_pairs_are_deterministic():
    for seed in range(6):
        a, b = instruction_pair(seed), instruction_pair(seed)
        assert a[1] == b[1] and np.array_equal(a[0], b[0]) and np.array_equal(a[2].image, b[2].image)
        assert not np.array_equal(a[0], a[2].image), f"seed {seed}: {a[1]!r} changed nothing"


def test_dataset_items_and_arrays_agree():
    dataset = WorldDataset(4, seed=3, task="fill")
    arrays = build_arrays("fill", 4, seed=3)
    item = dataset[2]
    assert item["image"].shape == (3, 64, 128) and item["mask"].shape == (1, 64, 128)  # tile | scene canvas
    assert np.array_equal(((item["image"].permute(1, 2, 0).numpy() + 1) * 127.5).round(), arrays["image"][2])
    assert item["caption"] == arrays["caption"][2]
    with pytest.raises(IndexError):
        dataset[4]
    with pytest.raises(ValueError, match="task='video'"):
        WorldDataset(4, task="video")


def test_image_folder_writer(tmp_path):
    paths = write_image_folder(tmp_path, 3, seed=1, task="kontext")
    records = [json.loads(line) for line in (tmp_path / "metadata.jsonl").read_text().splitlines()]
    assert len(paths) == len(records) == 3
    for path, record in zip(paths, records):
        assert path.is_file() and (tmp_path / record["context"]).is_file()
        assert path.parent.name in {o["shape"] for o in record["spec"]["objects"][:1]} | {"empty"}
