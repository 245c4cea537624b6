"""The world part of ``mmpos demo``: generate and edit with the trained world models, and a one-page report.

Sections, each beside its ground truth and with the method's diagnostic maps:
- text to image from captions (``FluxPipeline``);
- object insertion: plain Fill vs PE transplant (``PosBridgeFillPipeline``), with the transplanted ids;
- paste harmonisation: plain Kontext vs LooseRoPE (``LooseRoPEKontextPipeline``), with saliency bins and factors;
- style-aligned sets: no sharing vs band modulation at two strengths (``BandModulationFluxPipeline``), with the
  attention of one target query over the reference per frequency band;
- above the training size: one caption at 1x, 2x and 3x with stock RoPE, PI, NTK, YaRN, vision YaRN and DyPE;
- camera-controlled clips: the world video model without / with camera adapters along three trajectories.
"""
from __future__ import annotations

import html
import os
from pathlib import Path

import numpy as np

from mmpos.world.canvas import WORLD_TRANSPLANT
from mmpos.world.edit_runs import loose_for_steps, run_band, run_loose, run_transplant
from mmpos.world.edit_pairs import harmonise_pair, style_set, transplant_pair
from mmpos.world.images import save_png, to_chw
from mmpos.models.world.image import DEFAULT_ASSETS
from mmpos.models.world.samples import generate, held_out_examples, image_grid
from mmpos.world.sources import ModelSource, trained_tasks

from .section import Section

HARMONISE_SEED = 424_242  # harmonise pairs never seen in training (those come from instruction_pair seeds)
TRANSPLANT_SEED = 434_343  # insertion pairs never seen in training (those come from fill_canvas_example seeds)
STYLE_SEED = 444_444
BAND_STRENGTHS = (0.0, 0.5, 1.0)  # 0: shared attention with the bands unscaled
EXTRAPOLATION_SCALES = (1, 2, 3)
EXTRAPOLATION_CAPTIONS = 16  # the shown caption: the first of these with two objects on a patterned background


def world_models_available(root=None) -> bool:
    return bool(trained_tasks(root))


def error_map(output: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """uint8 ``[N, S, S, 3]`` heat map of the per-pixel max |output - truth| (black = exact, red = off)."""
    error = np.abs(output.astype(np.int16) - truth.astype(np.int16)).max(axis=-1).astype(np.float64) / 255
    heat = np.zeros(output.shape, dtype=np.uint8)
    heat[..., 0] = np.clip(error * 2 * 255, 0, 255).astype(np.uint8)
    heat[..., 1] = np.clip((error - 0.5) * 2 * 255, 0, 255).astype(np.uint8)
    return heat


def mask_image(masks: np.ndarray) -> np.ndarray:
    return np.repeat(masks[..., None].astype(np.uint8) * 255, 3, axis=-1)


def with_box(image: np.ndarray, box, colour=(255, 0, 0)) -> np.ndarray:
    """A copy of uint8 ``[S, S, 3]`` with the ``(left, top, right, bottom)`` box outlined one pixel inside."""
    left, top, right, bottom = box
    out = image.copy()
    out[top:bottom, [left, right - 1]] = colour
    out[[top, bottom - 1], left:right] = colour
    return out


def text_to_image_section(source: ModelSource, steps: int, count: int, out_dir: Path) -> Section:
    examples = held_out_examples("t2i", count, source.size("t2i"))
    outputs = generate(source.pipeline("generate"), "t2i", examples, steps, source.guidance("t2i"))
    truth = np.stack([e["image"] for e in examples])
    return Section("Text to image (FluxPipeline)", [("generated", outputs), ("ground truth", truth)],
                   [e["caption"] for e in examples])


def transplant_section(source: ModelSource, steps: int, count: int, out_dir: Path) -> Section:
    from mmpos.pipelines.figures import transplant_diagnostic

    from mmpos.world.canvas import insertion_canvas, scene_part
    from mmpos.eval.edit_scores import SCORE_NOTES, transplant_row

    pairs = [transplant_pair(TRANSPLANT_SEED + i, source.size("fill")) for i in range(count)]
    pipe, guidance = source.pipeline("transplant"), source.guidance("fill")
    options = WORLD_TRANSPLANT if source.is_world("fill") else {}  # pretrained Fill: the paper's layout
    plain = run_transplant(pipe, pairs, steps, {**options, "enabled": False}, guidance)
    edited = run_transplant(pipe, pairs, steps, options, guidance)
    truth = np.stack([p.target.image for p in pairs])
    rows = [("background, target box", np.stack([with_box(p.background.image, p.box) for p in pairs])),
            ("reference", np.stack([p.reference.image for p in pairs])), ("plain Fill", plain.outputs),
            ("PE transplant", edited.outputs), ("ground truth", truth),
            ("|error| transplant", error_map(edited.outputs, truth))]
    last = edited.last
    figure = transplant_diagnostic(last.canvas, last.ids, last.native_ids, out_dir / "world_transplant_ids.png")
    regions = [scene_part(insertion_canvas(p).mask) for p in pairs]  # the repainted (dilated) box
    table = [transplant_row("plain Fill", plain.outputs, pairs, regions, plain.raw),
             transplant_row("PE transplant", edited.outputs, pairs, regions, edited.raw),
             transplant_row("ground truth", truth, pairs, regions)]
    return Section("Object insertion: plain Fill vs PE transplant (PosBridgeFillPipeline)", rows,
                   [p.caption for p in pairs], [figure],
                   "Both rows run the same pipeline on the same canvas (reference tile left of the scene); plain "
                   "Fill is transplant.enabled=False. The red outline is the target box. The figure shows the last "
                   "example's canvas and the ids its tokens carry while sigma >= tau.",
                   table, SCORE_NOTES["transplant"])


def loose_section(source: ModelSource, steps: int, count: int, out_dir: Path) -> Section:
    from mmpos.pipelines import LooseConfig
    from mmpos.pipelines.figures import loose_diagnostic

    pairs = [harmonise_pair(HARMONISE_SEED + i, source.size("kontext")) for i in range(count)]
    pipe, guidance = source.pipeline("loose"), source.guidance("kontext")
    plain = run_loose(pipe, pairs, steps, loose_for_steps(steps, strength=0.0), guidance)
    config = loose_for_steps(steps)
    edited = run_loose(pipe, pairs, steps, config, guidance)
    truth = np.stack([p.target.image for p in pairs])
    rows = [("pasted", np.stack([p.collage for p in pairs])), ("plain Kontext", plain.outputs),
            ("LooseRoPE", edited.outputs), ("ground truth", truth),
            ("paste mask", mask_image(np.stack([p.paste_mask for p in pairs]))),
            ("|error| LooseRoPE", error_map(edited.outputs, truth))]
    figure = loose_diagnostic(edited.last.maps, LooseConfig(**config), out_dir / "world_loose_maps.png",
                              to_chw(pairs[-1].collage))
    from mmpos.eval.edit_scores import SCORE_NOTES, harmonise_row

    table = [harmonise_row("unedited collage", np.stack([p.collage for p in pairs]), pairs),
             harmonise_row("plain Kontext", plain.outputs, pairs), harmonise_row("LooseRoPE", edited.outputs, pairs),
             harmonise_row("ground truth", truth, pairs)]
    return Section("Paste harmonisation: plain Kontext vs LooseRoPE (LooseRoPEKontextPipeline)", rows,
                   [pairs[0].instruction], [figure],
                   "Plain Kontext is the same pipeline at strength 0. The figure shows the last example's token "
                   "saliency, bins and per-token factors.", table, SCORE_NOTES["harmonise"])


def band_section(source: ModelSource, steps: int, count: int, out_dir: Path) -> Section:
    from mmpos.pipelines.figures import band_attention_maps, band_diagnostic

    size = source.size("t2i")
    sets = [style_set(STYLE_SEED + i, 2, size) for i in range(max(count // 2, 1))]
    pipe, guidance = source.pipeline("band"), source.guidance("t2i")
    from mmpos.eval.edit_scores import SCORE_NOTES, style_row

    references = [s.reference for s in sets for _ in s.targets]
    rows = [("reference", np.stack([r.image for r in references])),
            ("no sharing", run_band(pipe, sets, steps, {"enabled": False}, guidance).outputs)]
    for strength in BAND_STRENGTHS:
        probe = (0, 0.5) if strength == BAND_STRENGTHS[-1] else None
        rows.append((f"band strength {strength}", run_band(pipe, sets, steps, {"strength": strength}, guidance,
                                                            probe=probe).outputs))
    rows.append(("ground truth", np.stack([t.image for s in sets for t in s.targets])))
    table = [style_row(label, images, references) for label, images in rows[1:]]
    grid = (size // pipe.token_pixels,) * 2
    token = grid[0] // 2 * grid[1] + grid[1] // 2
    maps = band_attention_maps(pipe.probe.query, pipe.probe.key, pipe.transformer.config.axes_dims_rope, grid, token)
    figure = band_diagnostic(maps, grid, token, out_dir / "world_band_attention.png", to_chw(sets[-1].reference.image))
    strengths = ", ".join(str(s) for s in BAND_STRENGTHS)
    return Section(f"Style-aligned sets: band modulation at strengths {strengths} (BandModulationFluxPipeline)", rows,
                   [p for s in sets for p in s.prompts], [figure],
                   "Targets get their content prompt only; the style comes from the shared reference image (no "
                   "sharing: no attention to it; strength 0: shared attention with the bands unscaled). The "
                   "figure: attention of the centre query of the last set's first target over its reference "
                   f"(layer 0, strength {BAND_STRENGTHS[-1]}, half-way through sampling), per frequency band.",
                   table, SCORE_NOTES["style"])


def extrapolation_section(source: ModelSource, steps: int, count: int, out_dir: Path) -> Section | None:
    """One held-out caption at 1x, 2x, 3x the world t2i model's training size, a row per method (the table over
    64 captions is ``scripts/eval_extrapolation.py``'s). Pretrained models are skipped (3x of 1024 px)."""
    from .extrapolation_runs import METHODS, figure_caption_index, generate_at_size, install_method, method_scale_tiles
    from mmpos.models.world.image import trained_image_size
    from mmpos.world.scene import SceneSpec

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
    return Section("Above the training size: stock RoPE, PI, NTK, YaRN, vision YaRN, DyPE (set_pe)", rows,
                   [example["caption"]], [],
                   f"Columns: {scales}, nearest-resized to one size; the same seed at every scale and method. At 1x "
                   "every preset is the stock model bit for bit, so 1x is the stock image on every row. Presets via "
                   "model_extrapolation(transformer, preset, trained_grid); DyPE follows the step's sigma. The table "
                   "over 64 captions: python scripts/eval_extrapolation.py (README).")


SECTIONS = (("t2i", "t2i", text_to_image_section), ("transplant", "fill", transplant_section),
            ("loose", "kontext", loose_section), ("band", "t2i", band_section),
            ("extrapolation", "t2i", extrapolation_section))


REPORT_STYLE = ("body{font-family:sans-serif;font-size:16px;max-width:1200px;margin:auto;padding:0 12px}"
                "img{image-rendering:pixelated;max-width:100%}.diag,.pe{image-rendering:auto}"
                "li{font-size:14px}table{border-collapse:collapse;margin:8px 0}"
                "td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}td:first-child{text-align:left}"
                "caption{caption-side:bottom;font-size:13px;text-align:left;padding-top:4px}"
                ".pe-grid{display:grid;grid-template-columns:1fr;gap:12px;justify-items:start}")


def score_table(rows: list[dict], note: str) -> str:
    """An HTML table of :mod:`~mmpos.eval.edit_scores` rows (method, then one column per score)."""
    columns = [k for k in rows[0] if k != "method"]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["method", *columns])
    body = "".join("<tr>" + f"<td>{html.escape(r['method'])}</td>" + "".join(f"<td>{r[c]:.3f}</td>" for c in columns)
                   + "</tr>" for r in rows)
    return f"<table><caption>{html.escape(note)}</caption><tr>{head}</tr>{body}</table>"


def write_report(out_dir: Path, sections: list[tuple[Section, Path]], extra: list[Path],
                 models: str = "small Flux-class models trained on mmpos.world") -> Path:
    """``report.html``: each section's grid, scores on the shown examples, captions, note and diagnostic figures;
    the encoding figures at their own size (up to the page width), each linked to its file."""
    parts = ["<!doctype html><meta charset='utf-8'><title>mmpos demo</title>", f"<style>{REPORT_STYLE}</style>",
             "<h1>mmpos demo: the mini-world</h1>",
             f"<p>Models: {html.escape(models)}; run through the diffusers pipelines and the mmpos editing "
             "pipelines on scenes of mmpos.world. Ground truth comes from the scene specs; |error| is the per-pixel "
             "max channel difference. Tables: the scores of <code>python scripts/eval_editing.py</code> "
             "(mmpos.eval.edit_scores) on the examples shown; the script's tables over more examples are in the "
             "README.</p>"]
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


def run_world_demo(out_dir, root=None, steps: int = 20, count: int = 6, extra_figures=(),
                   source: ModelSource | None = None) -> list[Path]:
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
    for name, task, build in tqdm(SECTIONS, desc="world demo", unit="section"):
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
