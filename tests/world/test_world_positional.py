"""Positional classification scenes: labels follow the objects' positions, deterministic per seed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmpos.cli import main
from mmpos.world.positional import CLASSES, positional_example, write_positional_folder


def centre(obj):
    x0, y0, x1, y1 = obj.box
    return (x0 + x1) / 2, (y0 + y1) / 2


@pytest.mark.parametrize("seed", range(40))
def test_relation_label_is_where_blue_is_relative_to_red(seed):
    image, label, spec = positional_example("relation", seed, 64)
    (red,) = [o for o in spec.objects if o.colour == "red"]
    (blue,) = [o for o in spec.objects if o.colour == "blue"]
    (rx, ry), (bx, by) = centre(red), centre(blue)
    dx, dy = bx - rx, by - ry
    assert abs(abs(dx) - abs(dy)) >= 64 / 8  # never ambiguous
    expected = (
        ("blue_right" if dx > 0 else "blue_left") if abs(dx) > abs(dy) else ("blue_below" if dy > 0 else "blue_above")
    )
    assert label == expected and image.shape == (64, 64, 3)
    assert (image == np.array([220, 40, 40])).all(-1).any()  # the red object is visible


@pytest.mark.parametrize("seed", range(20))
def test_quadrant_label_holds_the_star(seed):
    _, label, spec = positional_example("quadrant", seed, 32)
    (star,) = [o for o in spec.objects if o.shape == "star"]
    x, y = centre(star)
    assert label == ("top_" if y < 16 else "bottom_") + ("left" if x < 16 else "right")


def test_examples_are_deterministic_and_classes_balanced_enough():
    first = positional_example("relation", 7, 32)
    again = positional_example("relation", 7, 32)
    assert np.array_equal(first[0], again[0]) and first[1] == again[1]
    labels = [positional_example("relation", s, 32)[1] for s in range(200)]
    assert set(labels) == set(CLASSES["relation"])
    assert min(labels.count(c) for c in CLASSES["relation"]) > 25


def test_world_dataset_command_writes_an_image_folder(tmp_path):
    assert (
        main(
            ["world", "dataset", "--task", "relation", "--count", "6", "--size", "32", "--out", str(tmp_path / "train")]
        )
        == 0
    )
    assert sorted(p.name for p in (tmp_path / "train").iterdir() if p.is_dir()) == sorted(CLASSES["relation"])
    records = [json.loads(line) for line in (tmp_path / "train" / "metadata.jsonl").read_text().splitlines()]
    assert len(records) == 6 and all((tmp_path / "train" / r["file_name"]).exists() for r in records)
    with pytest.raises(FileExistsError):
        write_positional_folder(tmp_path / "train", 2)
    with pytest.raises(SystemExit) as exit_info:  # the command: one line, exit code 2
        main(["world", "dataset", "--task", "quadrant", "--out", str(tmp_path / "train")])
    assert exit_info.value.code == 2
