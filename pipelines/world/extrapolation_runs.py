"""The world t2i model above its training size: install an extrapolation preset, generate at a scale, and the
figure of one caption with every method at every scale. Shared by ``scripts/eval_extrapolation.py`` (the
64-caption table) and the ``mmpos demo`` report (one caption)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

METHODS = ("stock", "pi", "ntk", "yarn", "vision_yarn", "dype")


def install_method(pipe, method: str, trained_grid) -> None:
    """``method`` (``"stock"`` or a preset of :data:`mmpos.spectrum.schedule.PRESETS`, optionally ``+ultraimage``,
    ``+spa`` or ``+sega``: that attention rule over it, as ``mmpos generate`` sets it) on ``pipe.transformer``'s rows and columns from the trained ``(rows,
    cols)`` token grid; whatever ``set_pe`` and rule were there go first."""
    from mmpos.integrations.diffusers import (
        clear_attention_rule,
        model_extrapolation,
        restore,
        set_attention_rule,
        set_pe,
    )

    transformer = pipe.transformer
    clear_attention_rule(transformer)
    if getattr(transformer, "_mmpos_installed", None) is not None:
        restore(transformer)
    preset, _, rule = method.partition("+")
    if preset not in ("stock", "none"):
        set_pe(transformer, "native", extrapolation=model_extrapolation(transformer, preset, trained_grid))
    elif rule:
        set_pe(transformer, "native")
    if rule:
        from ..extrapolate import rule_config

        set_attention_rule(transformer, rule_config(rule, trained_grid))


def generate_at_size(pipe, examples, size: int, steps: int, guidance, batch: int) -> np.ndarray:
    """uint8 ``[N, size, size, 3]`` for the examples' captions; batch ``b`` uses seed ``b`` (the same noise for
    every method)."""
    from mmpos.models.world.samples import generate

    sized = [dict(e, image=np.zeros((size, size, 3), np.uint8)) for e in examples]
    return np.concatenate(
        [
            generate(pipe, "t2i", sized[i : i + batch], steps=steps, guidance=guidance, seed=i // batch)
            for i in range(0, len(sized), batch)
        ]
    )


def method_scale_tiles(images: dict, index: int, cell: int) -> dict:
    """``{method: {scale: uint8 [cell, cell, 3]}}``: caption ``index``'s image per method and scale, nearest-resized
    to ``cell``; a method without a scale (1x: every preset is the stock model there) shows the stock image."""
    from PIL import Image

    scales = sorted({s for per_scale in images.values() for s in per_scale})
    tiles = {}
    for method, per_scale in images.items():
        tiles[method] = {}
        for scale in scales:
            generated = per_scale.get(scale, images.get("stock", {}).get(scale))
            if generated is not None:
                tiles[method][scale] = np.asarray(Image.fromarray(generated[index]).resize((cell, cell), Image.NEAREST))
    return tiles


def extrapolation_figure(images: dict, truth: np.ndarray, index: int, path, cell: int = 96) -> Path:
    """One caption: a row per method, a column per scale, ground truth first (``images``: method -> scale ->
    uint8 ``[N, S, S, 3]``). Saved with a 128-colour palette."""
    from PIL import Image, ImageDraw

    tiles = method_scale_tiles(images, index, cell)
    scales = sorted({s for per_scale in tiles.values() for s in per_scale})
    label = 80
    canvas = Image.new("RGB", (label + (len(scales) + 1) * (cell + 2), 14 + len(tiles) * (cell + 2)), "white")
    draw = ImageDraw.Draw(canvas)
    for c, name in enumerate(["truth"] + [f"{s}x" for s in scales]):
        draw.text((label + c * (cell + 2) + 4, 1), name, fill="black")
    truth_tile = Image.fromarray(truth).resize((cell, cell), Image.NEAREST)
    for r, (method, per_scale) in enumerate(tiles.items()):
        top = 14 + r * (cell + 2)
        draw.text((4, top + cell // 2 - 6), method, fill="black")
        canvas.paste(truth_tile, (label, top))
        for c, scale in enumerate(scales, 1):
            if scale in per_scale:
                canvas.paste(Image.fromarray(per_scale[scale]), (label + c * (cell + 2), top))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.quantize(colors=128).save(path, optimize=True)
    return path


def figure_caption_index(specs) -> int:
    """The first scene with two objects on a patterned background (else 0)."""
    for i, spec in enumerate(specs):
        if len(spec.objects) == 2 and spec.style.background_pattern in ("stripes", "dots"):
            return i
    return 0
