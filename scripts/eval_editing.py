#!/usr/bin/env python
"""Ground-truth evaluation of the three PE editing tasks on the mini-world (mmpos.world).

    python scripts/eval_editing.py --checkpoint assets --count 16 --steps 20 --device cpu

Per task, every row is scored against ground truth rendered from the scene specs (mmpos.eval.metrics):
- transplant: inserted-object mask IoU, colour error, change outside the repainted (dilated) box (on the raw
  canvas output: the pipeline pastes the input back there, so its result is exact by construction); plain
  Fill (PosBridgeFillPipeline with transplant disabled: same canvas, same prompt) vs PE transplant at two tau.
- harmonise: identity (object mask IoU inside the paste) vs harmonisation (object texture similarity to the
  scene's style, |error| on the pasted background margin); the unedited collage, plain Kontext (LooseRoPE at
  strength 0), LooseRoPE at strengths 0.5, 1, 2.
- style: palette / texture similarity to the reference vs layout copy (IoU with the reference's objects);
  copying the reference, no sharing (content prompts alone), shared attention, band modulation as s_hf falls.
Every method row runs the edit method's runner (mmpos.pipelines.edits: the one the CLI and the demo run) on
the world model. A FLUX.2-architecture
t2i model (configs/world/cpu/t2i_flux2.yaml; --checkpoint a folder with world-vae/ and its world-t2i/) runs the
style rows through BandModulationFlux2KleinPipeline.
Writes JSON (default outputs/eval_editing.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mmpos.pipelines.world.sources import WORLD_GUIDANCE

MODEL_OF_TASK = {"transplant": "fill", "harmonise": "kontext", "style": "t2i"}  # evaluation task -> world model
LOOSE_STRENGTHS = (0.5, 1.0, 2.0)
BAND_ROWS = (
    ("shared attention (band strength 0)", {"strength": 0.0}),
    ("band s_hf=0.75", {"s_hf": (0.75, 0.75)}),
    ("band s_hf=0.5", {"s_hf": (0.5, 0.5)}),
    ("band s_hf=0.25", {"s_hf": (0.25, 0.25)}),
    ("band s_hf=0", {"s_hf": (0.0, 0.0)}),
    ("band paper schedule s_hf 0.25->0.75", {}),
)


def eval_transplant(args, pipes) -> list[dict]:
    from mmpos.eval.edit_scores import transplant_row
    from mmpos.pipelines.edits.transplant.demo import run_transplant
    from mmpos.world.canvas import WORLD_TRANSPLANT, insertion_canvas, scene_part
    from mmpos.world.edit_pairs import transplant_pair

    pairs = [transplant_pair(args.seed + i, args.sizes["fill"]) for i in range(args.count)]
    regions = [scene_part(insertion_canvas(p).mask) for p in pairs]  # the repainted (dilated) box

    def row(method, images, raw=None):
        return transplant_row(method, images, pairs, regions, raw)

    pipe = pipes("transplant")

    def run(method, **options):
        result = run_transplant(pipe, pairs, args.steps, {**WORLD_TRANSPLANT, **options})
        return row(method, result.outputs, result.raw)

    return [
        row("ground truth", [p.target.image for p in pairs]),
        run("plain Fill (same canvas)", enabled=False),
        run("PE transplant tau=0.85"),
        run("PE transplant tau=0.5", tau=0.5),
    ]


def eval_harmonise(args, pipes) -> list[dict]:
    from mmpos.eval.edit_scores import harmonise_row
    from mmpos.pipelines.edits.loose.demo import loose_for_steps, run_loose
    from mmpos.world.edit_pairs import harmonise_pair

    pairs = [harmonise_pair(args.seed + i, args.sizes["kontext"]) for i in range(args.count)]

    def row(method, images):
        return harmonise_row(method, images, pairs)

    pipe = pipes("loose")

    def run(strength):
        return run_loose(
            pipe, pairs, args.steps, loose_for_steps(args.steps, strength=strength), WORLD_GUIDANCE["kontext"]
        ).outputs

    return [
        row("ground truth", [p.target.image for p in pairs]),
        row("unedited collage", [p.collage for p in pairs]),
        row("plain Kontext (LooseRoPE strength 0)", run(0.0)),
    ] + [row(f"LooseRoPE strength {s}", run(s)) for s in LOOSE_STRENGTHS]


def eval_style(args, pipes) -> list[dict]:
    from mmpos.eval.edit_scores import style_row
    from mmpos.pipelines.edits.band.demo import run_band
    from mmpos.world.edit_pairs import style_set

    sets = [style_set(args.seed + i, 2, args.sizes["t2i"]) for i in range(max(args.count // 2, 1))]
    references = [s.reference for s in sets for _ in s.targets]

    def row(method, images):
        return style_row(method, images, references)

    pipe = pipes("band")

    def run(band):
        return run_band(pipe, sets, args.steps, band, WORLD_GUIDANCE["t2i"]).outputs

    rows = [
        row("ground truth (target in reference style)", [t.image for s in sets for t in s.targets]),
        row("copy the reference", [r.image for r in references]),
        row("no sharing (content prompt)", run({"enabled": False})),
    ]
    return rows + [row(name, run(band)) for name, band in BAND_ROWS]


def world_pipelines(root, device: str):
    """``method -> pipeline`` on the world models in ``root``; a FLUX.2-architecture t2i model (an
    ``architecture: flux2`` export) runs band modulation through ``BandModulationFlux2KleinPipeline`` (true CFG
    as the FLUX.1 world model, the reference given and noised as there)."""
    from mmpos.models.world.image import load_world_pipeline, world_architecture
    from mmpos.pipelines.world.sources import ModelSource

    source = ModelSource(root, device=device).pipeline
    if world_architecture(root, "t2i") != "flux2":
        return source
    from mmpos.pipelines import BandModulationFlux2KleinPipeline

    band = load_world_pipeline("t2i", root, device, pipeline_class=BandModulationFlux2KleinPipeline)
    band.set_progress_bar_config(disable=True)
    return lambda method: band if method == "band" else source(method)


def print_table(results: dict) -> None:
    for task, rows in results.items():
        print(f"\n== {task}")
        for row in rows:
            values = "  ".join(f"{k}={v}" for k, v in row.items() if k != "method")
            print(f"  {row['method']:42s} {values}")


def main(argv=None) -> int:
    from mmpos._arguments import DefaultsHelpFormatter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--checkpoint", help="folder with world-vae/ and world-<task>/ (default: assets/)")
    parser.add_argument("--count", type=int, default=16, help="examples per task")
    parser.add_argument("--steps", type=int, default=20, help="denoising steps")
    parser.add_argument("--seed", type=int, default=555_000, help="first example seed (held out from training)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device of the models")
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=["transplant", "harmonise", "style"],
        choices=("transplant", "harmonise", "style"),
        help="which evaluations to run",
    )
    parser.add_argument("--out", default="outputs/eval_editing.json", help="output JSON file (the scores)")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count must be at least 1, got {args.count}")

    from mmpos.models.world.image import check_world_checkpoint, trained_image_size

    try:
        root = check_world_checkpoint(
            args.checkpoint or Path(__file__).resolve().parents[1] / "assets",
            tasks=[MODEL_OF_TASK[t] for t in args.tasks],
        )
    except FileNotFoundError as error:
        parser.error(str(error))
    args.sizes = {task: trained_image_size(root, task) for task in MODEL_OF_TASK.values()}  # trained sides

    pipes = world_pipelines(root, args.device)

    evaluators = {"transplant": eval_transplant, "harmonise": eval_harmonise, "style": eval_style}
    from tqdm.auto import tqdm

    results = {task: evaluators[task](args, pipes) for task in tqdm(args.tasks, desc="eval_editing", unit="task")}
    print_table(results)
    from mmpos._atomic import written_atomically

    out = Path(args.out)
    with written_atomically(out) as temporary:
        temporary.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(f"\nwrote {out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
