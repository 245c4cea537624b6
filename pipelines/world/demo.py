"""The world part of ``mmpos demo``: generate and edit with the trained world models, and a one-page report.

Sections, each beside its ground truth and with the method's diagnostic maps:
- text to image from captions (``FluxPipeline``);
- one per registered edit method (its ``demo_section``, :mod:`mmpos.pipelines.edits`): object insertion, plain Fill
  vs PE transplant (``PosBridgeFillPipeline``), with the transplanted ids; paste harmonisation, plain Kontext vs
  LooseRoPE (``LooseRoPEKontextPipeline``), with saliency bins and factors; style-aligned sets, no sharing vs band
  modulation at three strengths (``BandModulationFluxPipeline``), with the attention of one target query over the
  reference per frequency band;
- above the training size: one caption at 1x, 2x and 3x with stock RoPE, PI, NTK, YaRN, vision YaRN and DyPE;
- camera-controlled clips: the world video model without / with camera adapters along three trajectories.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

import numpy as np

from mmpos.models.world.image import DEFAULT_ASSETS
from mmpos.models.world.samples import generate, held_out_examples, image_grid
from mmpos.world.images import save_png

from ..report import Section
from .sources import ModelSource, trained_tasks

EXTRAPOLATION_SCALES = (1, 2, 3)
EXTRAPOLATION_CAPTIONS = 16  # the shown caption: the first of these with two objects on a patterned background


def world_models_available(root=None) -> bool:
    return bool(trained_tasks(root))


def text_to_image_section(source: ModelSource, steps: int, count: int, out_dir: Path) -> Section:
    examples = held_out_examples("t2i", count, source.size("t2i"))
    outputs = generate(source.pipeline("generate"), "t2i", examples, steps, source.guidance("t2i"))
    truth = np.stack([e["image"] for e in examples])
    return Section(
        "Text to image (FluxPipeline)",
        [("generated", outputs), ("ground truth", truth)],
        [e["caption"] for e in examples],
    )


def extrapolation_section(source: ModelSource, steps: int, count: int, out_dir: Path) -> Section | None:
    """One held-out caption at 1x, 2x, 3x the world t2i model's training size, a row per method (the table over
    64 captions is ``scripts/eval_extrapolation.py``'s). Pretrained models are skipped (3x of 1024 px)."""
    from mmpos.models.world.image import trained_image_size
    from mmpos.world.scene import SceneSpec

    from .extrapolation_runs import METHODS, figure_caption_index, generate_at_size, install_method, method_scale_tiles

    if not source.is_world("t2i"):
        print("a pretrained t2i model: skipping the extrapolation section (it runs the world model at 3x)")
        return None
    trained = trained_image_size(source.root, "t2i")
    examples = held_out_examples("t2i", EXTRAPOLATION_CAPTIONS, trained)
    example = examples[figure_caption_index([SceneSpec.from_dict(e["spec"]) for e in examples])]
    pipe, guidance = source.pipeline("generate"), source.guidance("t2i")
    grid = (trained / (pipe.vae_scale_factor * 2),) * 2
    images = {method: {} for method in METHODS}
    try:
        for scale in EXTRAPOLATION_SCALES:
            for method in ("stock",) if scale == 1 else METHODS:  # at 1x every preset is the stock model
                install_method(pipe, method, grid)
                images[method][scale] = generate_at_size(pipe, [example], trained * scale, steps, guidance, 1)
    finally:
        install_method(pipe, "stock", grid)  # the other sections share the transformer
    from PIL import Image

    cell = trained * max(EXTRAPOLATION_SCALES)
    tiles = method_scale_tiles(images, 0, cell)
    truth = np.asarray(Image.fromarray(example["image"]).resize((cell, cell), Image.NEAREST))
    rows = [("ground truth", np.stack([truth] * len(EXTRAPOLATION_SCALES)))]
    rows += [(method, np.stack([per_scale[s] for s in EXTRAPOLATION_SCALES])) for method, per_scale in tiles.items()]
    scales = ", ".join(f"{s}x ({trained * s} px)" for s in EXTRAPOLATION_SCALES)
    return Section(
        "Above the training size: stock RoPE, PI, NTK, YaRN, vision YaRN, DyPE (set_pe)",
        rows,
        [example["caption"]],
        [],
        f"Columns: {scales}, nearest-resized to one size; the same seed at every scale and method. At 1x "
        "every preset is the stock model bit for bit, so 1x is the stock image on every row. Presets via "
        "model_extrapolation(transformer, preset, trained_grid); DyPE follows the step's sigma. The table "
        "over 64 captions: python scripts/eval_extrapolation.py (docs/results.md).",
    )


def sections() -> list:
    """``(name, task, build)`` of every section in report order: text to image, each registered edit method's
    demo section (:attr:`~mmpos.pipelines.edits.EditMethod.demo_section`, by ``demo_order``), extrapolation."""
    from ..edits import get_edit, list_edits

    edits = sorted((get_edit(name) for name in list_edits()), key=lambda method: method.demo_order)
    return [
        ("t2i", "t2i", text_to_image_section),
        *[(m.name, m.world_task, m.demo_section) for m in edits if m.demo_section is not None],
        ("extrapolation", "t2i", extrapolation_section),
    ]


REPORT_STYLE = (
    "body{font-family:sans-serif;font-size:16px;max-width:1200px;margin:auto;padding:0 12px}"
    "img{image-rendering:pixelated;max-width:100%}.diag,.pe{image-rendering:auto}"
    "li{font-size:14px}table{border-collapse:collapse;margin:8px 0}"
    "td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}td:first-child{text-align:left}"
    "caption{caption-side:bottom;font-size:13px;text-align:left;padding-top:4px}"
    ".pe-grid{display:grid;grid-template-columns:1fr;gap:12px;justify-items:start}"
)


def score_table(rows: list[dict], note: str) -> str:
    """An HTML table of :mod:`~mmpos.eval.edit_scores` rows (method, then one column per score)."""
    columns = [k for k in rows[0] if k != "method"]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["method", *columns])
    body = "".join(
        "<tr>" + f"<td>{html.escape(r['method'])}</td>" + "".join(f"<td>{r[c]:.3f}</td>" for c in columns) + "</tr>"
        for r in rows
    )
    return f"<table><caption>{html.escape(note)}</caption><tr>{head}</tr>{body}</table>"


def write_report(
    out_dir: Path,
    sections: list[tuple[Section, Path]],
    extra: list[Path],
    models: str = "small Flux-class models trained on mmpos.world",
) -> Path:
    """``report.html``: each section's grid, scores on the shown examples, captions, note and diagnostic figures;
    the encoding figures at their own size (up to the page width), each linked to its file."""
    parts = [
        "<!doctype html><meta charset='utf-8'><title>mmpos demo</title>",
        f"<style>{REPORT_STYLE}</style>",
        "<h1>mmpos demo: the mini-world</h1>",
        f"<p>Models: {html.escape(models)}; run through the diffusers pipelines and the mmpos editing "
        "pipelines on scenes of mmpos.world. Ground truth comes from the scene specs; |error| is the per-pixel "
        "max channel difference. Tables: the scores of <code>python scripts/eval_editing.py</code> "
        "(mmpos.eval.edit_scores) on the examples shown; the script's tables over more examples are in "
        "docs/results.md.</p>",
    ]
    for section, path in sections:
        parts += [f"<h2>{html.escape(section.title)}</h2>", f"<img src='{path.name}'>"]
        if section.table:
            parts.append(score_table(section.table, section.table_note))
        if section.note:
            parts.append(f"<p>{html.escape(section.note)}</p>")
        parts += [f"<img class='diag' src='{d.name}'>" for d in section.diagnostics]
        parts += ["<ol>"] + [f"<li>{html.escape(c)}</li>" for c in section.captions] + ["</ol>"]
    if extra:
        links = [os.path.relpath(p, out_dir) for p in extra]
        parts += ["<h2>Encodings</h2>", "<div class='pe-grid'>"]
        parts += [f"<a href='{link}'><img class='pe' src='{link}'></a>" for link in links] + ["</div>"]
    report = out_dir / "report.html"
    report.write_text("\n".join(parts))
    return report


def _camera_clips(out_dir: Path, source: ModelSource, done: list) -> list[Path]:
    """The camera-controlled clips section (:mod:`.video_demo`) when the world video model is shipped."""
    from .video_demo import camera_clips_section

    section = camera_clips_section(out_dir, source.root)
    if section is None:
        return []
    path = out_dir / "world_camera_clips.png"
    save_png(path, image_grid(section.rows))
    done.append((section, path))
    return [path, *section.diagnostics]


def run_world_demo(
    out_dir, root=None, steps: int = 20, count: int = 6, extra_figures=(), source: ModelSource | None = None
) -> list[Path]:
    """Run every section whose model is there (world checkpoints under ``root``, or ``source``); write a grid PNG
    per section, the diagnostic figures and ``report.html``; returns the written paths."""
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    source = source if source is not None else ModelSource(root)
    available = source.tasks()
    if not available:
        from mmpos.models.world.image import check_world_checkpoint

        check_world_checkpoint(source.root if source.root is not None else DEFAULT_ASSETS)  # a clear error
    done, written = [], []
    for name, task, build in tqdm(sections(), desc="world demo", unit="section"):
        if task not in available:
            print(f"no {task} model; skipping the {name} section")
            continue
        section = build(source, steps, count, out_dir)
        if section is None:
            continue
        path = out_dir / f"world_{name}.png"
        save_png(path, image_grid(section.rows, zoom=3))
        done.append((section, path))
        written += [path, *section.diagnostics]
    written += _camera_clips(out_dir, source, done)
    return written + [write_report(out_dir, done, [Path(p) for p in extra_figures], source.describe())]
