"""World datasets: an on-the-fly torch ``Dataset``, an ImageFolder writer, and in-memory training arrays.

Example ``i`` of a dataset with seed ``s`` is generated from seed ``s * 1_000_003 + i``, so any example can be
rebuilt alone and every worker count gives the same data.
"""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from .._atomic import check_new_output, output_folder_written
from .._validation import check_choice, check_non_negative_int, check_positive_int
from .canvas import fill_canvas_example
from .edit_pairs import instruction_pair
from .images import save_png
from .render import render_scene
from .scene import sample_scene

DATA_TASKS = ("scenes", "fill", "kontext")
SEED_STRIDE = 1_000_003


def example_seed(seed: int, index: int) -> int:
    return seed * SEED_STRIDE + index


def make_example(task: str, seed: int, image_size: int = 64) -> dict:
    """One example as numpy arrays and strings (``image`` uint8 [S,S,3], ``mask`` bool [S,S]; fill examples are
    ``S x 2S`` canvases, see :mod:`mmpos.world.canvas`)."""
    check_choice("task", task, DATA_TASKS)
    if task == "scenes":
        rendered = render_scene(sample_scene(seed, image_size))
        return {
            "image": rendered.image,
            "caption": rendered.spec.caption(),
            "content_caption": rendered.spec.caption(include_style=False),
            "masks": rendered.masks,
            "spec": rendered.spec.to_dict(),
        }
    if task == "fill":  # S x 2S canvases: reference tile | scene (mmpos.world.canvas)
        canvas = fill_canvas_example(seed, image_size)
        return {"image": canvas.image, "mask": canvas.mask, "caption": canvas.caption, "spec": canvas.spec}
    context, instruction, target = instruction_pair(seed, image_size)
    return {"image": target.image, "context": context, "caption": instruction, "spec": target.spec.to_dict()}


class WorldDataset(torch.utils.data.Dataset):
    """``num_examples`` examples generated on the fly; images as float ``[3, S, S]`` in [-1, 1]."""

    def __init__(self, num_examples: int, seed: int = 0, task: str = "scenes", image_size: int = 64):
        check_choice("task", task, DATA_TASKS)
        self.num_examples = check_positive_int("num_examples", num_examples)
        self.seed = check_non_negative_int("seed", seed)
        self.task, self.image_size = task, image_size

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.num_examples:
            raise IndexError(f"index {index} out of range for {self.num_examples} examples")
        example = make_example(self.task, example_seed(self.seed, index), self.image_size)
        item = {"image": to_tensor(example["image"]), "caption": example["caption"]}
        if "mask" in example:
            item["mask"] = torch.from_numpy(example["mask"]).float()[None]
        if "context" in example:
            item["context"] = to_tensor(example["context"])
        return item


def to_tensor(image: np.ndarray) -> torch.Tensor:
    """uint8 ``[S, S, 3]`` -> float ``[3, S, S]`` in [-1, 1] (what the pipelines' image processors make)."""
    return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float() / 127.5 - 1.0


def write_image_folder(
    out_dir,
    num_examples: int,
    seed: int = 0,
    task: str = "scenes",
    image_size: int = 64,
    progress: bool = False,
    overwrite: bool = False,
):
    """``out_dir/<class>/<index>.png`` (class = first object's shape, or ``edit`` pairs for kontext/fill),
    masks/contexts beside them, and ``metadata.jsonl`` with caption and scene spec per file. Written under a
    temporary folder renamed into place; an ``out_dir`` holding files is refused unless ``overwrite`` (then
    replaced whole: no stale class folders are left)."""
    final = check_new_output(out_dir, overwrite)
    check_positive_int("num_examples", num_examples)
    with output_folder_written(final, overwrite) as out_dir:  # a second writer at once: ConcurrentWriteError
        written = _write_examples(out_dir, num_examples, seed, task, image_size, progress)
    return [final / p.relative_to(out_dir) for p in written]


def _write_examples(
    out_dir: Path, num_examples: int, seed: int, task: str, image_size: int, progress: bool = False
) -> list[Path]:
    from tqdm.auto import tqdm

    written = []
    with open(out_dir / "metadata.jsonl", "w") as meta:
        for index in tqdm(range(num_examples), desc="world dataset", unit="image", disable=not progress):
            example = make_example(task, example_seed(seed, index), image_size)
            objects = example["spec"]["objects"]
            folder = out_dir / (objects[0]["shape"] if objects else "empty")
            folder.mkdir(exist_ok=True)
            path = folder / f"{index:06d}.png"
            save_png(path, example["image"])
            record = {
                "file_name": str(path.relative_to(out_dir)),
                "caption": example["caption"],
                "spec": example["spec"],
            }
            for extra in ("mask", "context"):
                if extra in example:
                    extra_path = folder / f"{index:06d}_{extra}.png"
                    array = example[extra].astype(np.uint8) * 255 if extra == "mask" else example[extra]
                    save_png(extra_path, array)
                    record[extra] = str(extra_path.relative_to(out_dir))
            meta.write(json.dumps(record) + "\n")
            written.append(path)
    return written


def _chunk(args) -> dict:
    task, seeds, image_size = args
    examples = [make_example(task, s, image_size) for s in seeds]
    arrays = {"image": np.stack([e["image"] for e in examples]), "caption": [e["caption"] for e in examples]}
    for key in ("mask", "context"):
        if key in examples[0]:
            arrays[key] = np.stack([e[key] for e in examples])
    if "content_caption" in examples[0]:
        arrays["content_caption"] = [e["content_caption"] for e in examples]
    return arrays


def build_arrays(task: str, num_examples: int, seed: int = 0, image_size: int = 64, workers: int = 1) -> dict:
    """All examples stacked (``image`` uint8 [N,S,S,3], ``mask`` bool [N,S,S], ``context``, captions)."""
    check_choice("task", task, DATA_TASKS)
    check_positive_int("num_examples", num_examples)
    seeds = [example_seed(seed, i) for i in range(num_examples)]
    chunks = [(task, seeds[i : i + 256], image_size) for i in range(0, num_examples, 256)]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            parts = list(pool.map(_chunk, chunks))
    else:
        parts = [_chunk(c) for c in chunks]
    return {
        key: (
            sum((p[key] for p in parts), [])
            if isinstance(parts[0][key], list)
            else np.concatenate([p[key] for p in parts])
        )
        for key in parts[0]
    }
