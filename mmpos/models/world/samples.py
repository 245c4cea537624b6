"""Held-out examples, running the world pipelines on them, and labelled image grids."""

from __future__ import annotations

import numpy as np
import torch

from ...world.data import example_seed, make_example
from ...world.images import to_uint8
from .image import conditioning

HELD_OUT_SEED = 987_654  # dataset seed of examples never used in training (training uses small seeds)


def held_out_examples(task: str, count: int, image_size: int = 64, seed: int = HELD_OUT_SEED) -> list[dict]:
    data_task = {"t2i": "scenes", "vae": "scenes"}.get(task, task)
    return [make_example(data_task, example_seed(seed, i), image_size) for i in range(count)]


def _pil(array: np.ndarray):
    from PIL import Image

    return Image.fromarray(array)


def generate(
    pipe, task: str, examples: list[dict], steps: int = 20, guidance: float | None = 3.0, seed: int = 0, **call_kwargs
) -> np.ndarray:
    """uint8 ``[N, H, W, 3]`` outputs of ``pipe`` (a pipeline for ``task``) on ``examples``; ``guidance`` as in
    :func:`~mmpos.models.world.image.conditioning`."""
    height, width = examples[0]["image"].shape[:2]
    captions = [e["caption"] for e in examples]
    kwargs = dict(
        height=height,
        width=width,
        num_inference_steps=steps,
        output_type="np",
        generator=torch.Generator().manual_seed(seed),
        **call_kwargs,
    )
    kwargs.update(conditioning(pipe, captions, guidance))
    if task == "fill":
        kwargs.update(
            image=[_pil(e["image"]) for e in examples],
            mask_image=[_pil(e["mask"].astype(np.uint8) * 255) for e in examples],
        )
    if task == "kontext":
        kwargs.update(image=[_pil(e["context"]) for e in examples], max_area=height * width, _auto_resize=False)
    return to_uint8(pipe(**kwargs).images)


def inputs_row(task: str, examples: list[dict]) -> tuple[str, np.ndarray] | None:
    """The row showing what the model was given (masked image for fill, context for kontext)."""
    if task == "fill":
        return "masked input", np.stack([np.where(e["mask"][..., None], 128, e["image"]) for e in examples])
    if task == "kontext":
        return "context", np.stack([e["context"] for e in examples])
    return None


def image_grid(
    rows: list[tuple[str, np.ndarray]], zoom: int = 2, label_width: int | None = None, font_size: int = 15
) -> np.ndarray:
    """uint8 grid: one labelled row per ``(label, images [N, H, W, 3])`` (all rows the same ``H, W``), images
    upscaled by ``zoom``; labels in a ``font_size`` px font, in a column as wide as the longest (or
    ``label_width`` px)."""
    from PIL import Image, ImageDraw

    shapes = {images.shape[1:3] for _, images in rows}
    if len(shapes) != 1:
        raise ValueError(f"image_grid rows must share one image size, got {sorted(shapes)}")
    height, width = (side * zoom for side in shapes.pop())
    columns = max(len(images) for _, images in rows)
    font = label_font(font_size)
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    label_width = label_width or int(max(measure.textlength(label, font=font) for label, _ in rows)) + 12
    canvas = Image.new("RGB", (label_width + columns * (width + 2), len(rows) * (height + 2)), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for r, (label, images) in enumerate(rows):
        top = r * (height + 2)
        draw.text((4, top + height // 2), label, fill=(0, 0, 0), font=font, anchor="lm")
        for c, image in enumerate(images):
            tile = Image.fromarray(image).resize((width, height), Image.NEAREST)
            canvas.paste(tile, (label_width + c * (width + 2), top))
    return np.asarray(canvas)


def label_font(size: int):
    """Pillow's scalable default font at ``size`` px (its bitmap fallback drops spaces: "no sharing" read
    "nosharing")."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: the bitmap font only
        return ImageFont.load_default()
