"""Multi-resolution evaluation of a trained ViT: top-1/top-5 at several sizes and aspect ratios, with the
encodings' extrapolation options.

Extrapolation (``factor`` = evaluated grid / trained grid, the larger of the two axes):

* ``none``: the encoding as trained (coordinates keep growing with the grid; learned APE tables resampled);
* ``pi``: position interpolation for every coordinate-based encoding (rotary and ``ape_sincos``): patch
  coordinates scaled by ``1 / factor`` (the converted model's ``mmpos_positions.grid_scale``);
* ``ntk`` / ``yarn``: the encoding's ``extrapolation`` option (``rope_axial``, and ``harope`` through its base
  encoding); the model is rebuilt with the option and the trained weights are loaded.

A combination an encoding does not support is reported with ``top1 = None`` and a ``note``.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import torch
from timm.utils import accuracy

from .._atomic import written_atomically
from .scaffold.config import ConfigError
from .task_configs import ViTConfig
from .vit_data import eval_loader, eval_transform, make_dataset, match_classes
from .vit_model import build_vit, load_weights, patch_size_of, plain_model

EXTRAPOLATIONS = ("none", "pi", "ntk", "yarn")
COORDINATE_PES = ("rope_axial", "rope_mixed", "comrope_ld", "comrope_ap", "harope", "ape_sincos", "liere")


@torch.no_grad()
def evaluate(model, loader, accelerator) -> dict:
    """top-1 / top-5 (percent) of ``model`` over ``loader`` (gathered over processes)."""
    model.eval()
    correct1 = correct5 = count = 0
    for images, targets in loader:
        with accelerator.autocast():
            logits = model(images)
        logits, targets = accelerator.gather_for_metrics((logits.float(), targets))
        top1, top5 = accuracy(logits, targets, topk=(1, min(5, logits.shape[-1])))
        correct1 += top1.item() * len(targets) / 100
        correct5 += top5.item() * len(targets) / 100
        count += len(targets)
        classes = logits.shape[-1]
    top5 = 100 * correct5 / count if classes > 5 else None  # with 5 classes or fewer top-5 is 100 % by definition
    return {"top1": 100 * correct1 / count, "top5": top5, "count": count, "classes": classes}


def _extrapolation_options(config: ViTConfig, kind: str, factor: float, grid: int) -> dict | None:
    pe = config.pe
    policy = {"type": kind, "factor": factor}
    if kind == "yarn":
        policy["original_length"] = grid
    options = dict(config.pe_options or {})
    if pe == "rope_axial":
        return {**options, "extrapolation": policy}
    if pe == "harope" and options.get("base", "rope_axial") == "rope_axial":
        return {**options, "base_options": {**options.get("base_options", {}), "extrapolation": policy}}
    return None


def _model_for(kind, factor, config, model, state_dict, num_classes, grid):
    """(model to evaluate, note) for one extrapolation kind at one factor; model None if unsupported."""
    if kind == "none" or factor <= 1:
        return model, ""
    if kind == "pi":
        if config.pe not in COORDINATE_PES:
            return None, f"pi needs a coordinate-based encoding, not {config.pe!r}"
        scaled = copy.deepcopy(model)
        scaled.mmpos_positions.grid_scale = scaled.mmpos_positions.grid_scale / factor
        return scaled, ""
    options = _extrapolation_options(config, kind, factor, grid)
    if options is None:
        return None, f"{kind} is an option of rope_axial / harope, not of {config.pe!r}"
    rebuilt = build_vit(replace(config, pretrained=False), num_classes, pe_options=options)
    load_weights(rebuilt, state_dict)
    return rebuilt.to(next(model.parameters()).device), ""


def evaluate_resolutions(
    config: ViTConfig,
    model,
    accelerator,
    sizes,
    aspects=(1.0,),
    extrapolations=("none",),
    num_classes: int | None = None,
    train_classes: dict | None = None,
) -> list[dict]:
    """One row per (size, aspect, extrapolation): ``height``, ``width``, ``scale``, ``top1``, ``top5``.

    ``train_classes``: the training split's ``class_to_idx``; the evaluation split is labelled by class name
    with it (:func:`~.vit_data.match_classes`)."""
    bad = [k for k in extrapolations if k not in EXTRAPOLATIONS]
    if bad:
        raise ConfigError(f"eval_extrapolation: unknown {bad}; expected some of {list(EXTRAPOLATIONS)}")
    model = plain_model(accelerator, model)
    state_dict = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    num_classes = num_classes or model.num_classes
    patch = patch_size_of(model)
    grid = config.img_size // patch
    rows = []
    for size in sizes:
        for aspect in aspects:
            height, width = int(size), int(round(size * aspect / patch)) * patch
            dataset = make_dataset(config, config.val_split, eval_transform(config, model, height, width))
            match_classes(dataset, train_classes, config.val_split)
            loader = accelerator.prepare(eval_loader(dataset, config))
            factor = max(height, width) / config.img_size
            for kind in extrapolations:
                if kind != "none" and factor <= 1:
                    continue
                candidate, note = _model_for(kind, factor, config, model, state_dict, num_classes, grid)
                row = {
                    "size": int(size),
                    "height": height,
                    "width": width,
                    "aspect": aspect,
                    "scale": size / config.img_size,
                    "extrapolation": kind,
                }
                row.update(
                    evaluate(candidate, loader, accelerator)
                    if candidate is not None
                    else {"top1": None, "top5": None, "note": note}
                )
                rows.append(row)
    return rows


def plot_series(results: dict[str, list[dict]]) -> list[dict]:
    """The lines of :func:`plot_results`: one per (model label, extrapolation, aspect ratio), each ``label``,
    ``aspect``, ``extrapolation`` and ``points`` ``[(size, top1), ...]`` sorted by size (the evaluated height).
    An extrapolation's line starts from the plain rows at or below the training size; unsupported rows
    (``top1`` None) are left out."""
    series = []
    for label, rows in results.items():
        for aspect in dict.fromkeys(r.get("aspect", 1.0) for r in rows):
            for kind in dict.fromkeys(r["extrapolation"] for r in rows):
                points = sorted(
                    (r["size"], r["top1"])
                    for r in rows
                    if r.get("aspect", 1.0) == aspect
                    and r["top1"] is not None
                    and (r["extrapolation"] == kind or (r["extrapolation"] == "none" and r["scale"] <= 1))
                )
                if (len(points) > 1 or kind == "none") and points:
                    name = label if kind == "none" else f"{label} ({kind})"
                    name += "" if aspect == 1.0 else f", w/h {aspect:g}"
                    series.append({"label": name, "aspect": aspect, "extrapolation": kind, "points": points})
    return series


def plot_results(results: dict[str, list[dict]], path, title: str = "accuracy vs resolution") -> Path:
    """PNG of top-1 vs evaluated size (height): one line per :func:`plot_series` entry, so every aspect ratio
    evaluated has its own lines (solid: no extrapolation, dashed: an extrapolation; square markers: not square)."""
    from ..viz.figure_files import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(6, 4))
    for line in plot_series(results):
        xs, ys = zip(*line["points"])
        ax.plot(
            xs,
            ys,
            marker="o" if line["aspect"] == 1.0 else "s",
            linestyle="-" if line["extrapolation"] == "none" else "--",
            label=line["label"],
        )
    classes = {r["classes"] for rows in results.values() for r in rows if r.get("classes")}
    if len(classes) == 1:  # one label set: guessing's accuracy
        (count,) = classes
        ax.axhline(100 / count, color="gray", linestyle=":", label=f"chance (1/{count})")
    ax.set_ylim(0, 100)  # fixed: two plots compare at a glance
    ax.set_xlabel("evaluation resolution (px, height)")
    ax.set_ylabel("top-1 (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def save_results(rows: list[dict], path) -> Path:
    path = Path(path)
    with written_atomically(path) as temporary:
        temporary.write_text(json.dumps(rows, indent=1))
    return path
