"""Positional classification scenes: the label depends on WHERE things are, not on what they look like.

Tasks (``POSITIONAL_TASKS``):

* ``relation``: a red and a blue object (random shapes) and up to two distractors in other colours; the class
  is where the blue object sits relative to the red one: ``blue_left``, ``blue_right``, ``blue_above``,
  ``blue_below`` (the larger of the horizontal and vertical offsets, by a margin of at least 1/8 image).
  A position-free (NoPE) ViT cannot do better than chance: the answer is a relation between positions.
* ``quadrant``: one star and up to three other shapes; the class is the quadrant holding the star's centre
  (``top_left``, ``top_right``, ``bottom_left``, ``bottom_right``); an absolute-position task.

Example ``i`` of a split with seed ``s`` comes from seed ``s * 1_000_003 + i`` (as :mod:`mmpos.world.data`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._atomic import check_new_output, output_folder_written
from .._validation import check_choice, check_positive_int
from .images import save_png
from .render import render_scene
from .scene import SHAPES, SIZES, ObjectSpec, SceneSpec, SceneStyle, sample_box

POSITIONAL_TASKS = ("relation", "quadrant")
CLASSES = {
    "relation": ("blue_above", "blue_below", "blue_left", "blue_right"),
    "quadrant": ("bottom_left", "bottom_right", "top_left", "top_right"),
}
BACKGROUNDS = ("white", "gray", "black", "yellow")
DISTRACTOR_COLOURS = ("green", "cyan", "orange", "brown", "white", "black", "yellow", "gray")
SEED_STRIDE = 1_000_003


def _centre(box) -> tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def _distractors(rng, image_size, background, boxes, count) -> list[ObjectSpec]:
    colours = [c for c in DISTRACTOR_COLOURS if c != background]
    objects = []
    for _ in range(count):
        box = sample_box(rng, image_size, "small", boxes)
        if box is None:
            break
        boxes.append(box)
        shape = str(rng.choice([s for s in SHAPES if s != "star"]))
        objects.append(ObjectSpec(shape, str(rng.choice(colours)), box, "small"))
    return objects


def _relation(rng, image_size):
    margin = image_size / 8
    while True:
        red = sample_box(rng, image_size, str(rng.choice(list(SIZES))))
        blue = sample_box(rng, image_size, str(rng.choice(list(SIZES))), [red])
        if blue is None:
            continue
        (rx, ry), (bx, by) = _centre(red), _centre(blue)
        dx, dy = bx - rx, by - ry
        if abs(abs(dx) - abs(dy)) >= margin:
            break
    if abs(dx) > abs(dy):
        label = "blue_right" if dx > 0 else "blue_left"
    else:
        label = "blue_below" if dy > 0 else "blue_above"
    objects = [ObjectSpec(str(rng.choice(SHAPES)), "red", red), ObjectSpec(str(rng.choice(SHAPES)), "blue", blue)]
    return objects, [red, blue], label, 2


def _quadrant(rng, image_size):
    half = image_size / 2
    while True:
        star = sample_box(rng, image_size, "large")
        x, y = _centre(star)
        if abs(x - half) >= 2 and abs(y - half) >= 2:
            break
    label = ("top_" if y < half else "bottom_") + ("left" if x < half else "right")
    return [ObjectSpec("star", "red", star)], [star], label, 3


def positional_example(task: str, seed: int, image_size: int = 64) -> tuple[np.ndarray, str, SceneSpec]:
    """One example: (uint8 image ``[S, S, 3]``, class name, scene spec); identical for identical arguments."""
    check_choice("task", task, POSITIONAL_TASKS)
    if image_size < 32:
        raise ValueError(f"image_size must be at least 32 pixels, got {image_size}")
    rng = np.random.default_rng(seed)
    background = str(rng.choice(BACKGROUNDS))
    objects, boxes, label, max_distractors = (_relation if task == "relation" else _quadrant)(rng, image_size)
    objects += _distractors(rng, image_size, background, list(boxes), int(rng.integers(0, max_distractors + 1)))
    order = rng.permutation(len(objects))  # distractors may be drawn under or over the named objects
    spec = SceneSpec(image_size, SceneStyle(background), tuple(objects[i] for i in order))
    return render_scene(spec).image, label, spec


def write_positional_folder(
    out_dir,
    num_examples: int,
    seed: int = 0,
    task: str = "relation",
    image_size: int = 64,
    progress: bool = False,
    overwrite: bool = False,
) -> list[Path]:
    """ImageFolder layout ``out_dir/<class>/<index>.png`` (every class folder made, even if empty) and
    ``metadata.jsonl`` (file, label, scene spec). Files are written under a temporary folder renamed into place;
    an ``out_dir`` holding files is refused unless ``overwrite`` (then replaced whole)."""
    from tqdm.auto import tqdm

    check_choice("task", task, POSITIONAL_TASKS)
    check_positive_int("num_examples", num_examples)
    out_dir = check_new_output(out_dir, overwrite)
    written = []
    with output_folder_written(out_dir, overwrite) as tmp:
        for name in CLASSES[task]:
            (tmp / name).mkdir(parents=True, exist_ok=True)
        with open(tmp / "metadata.jsonl", "w") as meta:
            for index in tqdm(range(num_examples), desc="world dataset", unit="image", disable=not progress):
                image, label, spec = positional_example(task, seed * SEED_STRIDE + index, image_size)
                relative = f"{label}/{index:06d}.png"
                save_png(tmp / relative, image)
                meta.write(json.dumps({"file_name": relative, "label": label, "spec": spec.to_dict()}) + "\n")
                written.append(out_dir / relative)
    return written
