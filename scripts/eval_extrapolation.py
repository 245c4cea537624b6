"""Generating above the training size on the mini-world: stock RoPE vs PI, NTK, YaRN, vision YaRN and DyPE.

The world text-to-image model (``assets/world-t2i``, FluxPipeline, trained at 32 px = 8 x 8 tokens) generates
held-out captions at 1x, 2x and 3x its training size with each extrapolation preset (same captions, same seeds
per scale), and each image is scored against its caption's scene (:mod:`mmpos.eval.layout_metrics`): object
count error and duplication (repetition), position accuracy, background pattern period. At 1x every preset is
the stock model bit for bit (checked on the first batch), so 1x runs once.

    OMP_NUM_THREADS=1 nice -n 10 python scripts/eval_extrapolation.py --count 64 --steps 10 \\
        --out outputs/extrapolation --figure assets/extrapolation/world_t2i.png
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from mmpos._atomic import ConcurrentWriteError, claimed_output
from mmpos.eval.layout_metrics import layout_scores
from mmpos.models.world.image import load_world_pipeline, trained_image_size
from mmpos.models.world.samples import held_out_examples
from mmpos.pipelines.world.extrapolation_runs import (
    METHODS,
    extrapolation_figure,
    figure_caption_index,
    generate_at_size,
    install_method,
)
from mmpos.world.scene import SceneSpec

EXTRA_METHODS = ("dype_ntk", "dype_yarn")  # DyPE through NTK or YaRN, on request
# UltraImage's, SPA's and SEGA's attention rules alone and over a preset (issue 45), on request
RULE_METHODS = tuple(f"{p}+{r}" for r in ("ultraimage", "spa", "sega") for p in ("none", "pi", "ntk", "dype"))
SCORES = ("count_error", "duplicated", "position_acc", "period_ratio")


def summarise(images, specs) -> dict:
    """Mean, spread and median of each score over the captions (``period_ratio``: patterned backgrounds only),
    and ``period_kept``: the fraction of those whose pattern period is within 25% of the ground truth's."""
    rows = [layout_scores(image, spec) for image, spec in zip(images, specs)]
    out = {}
    for name in SCORES:
        values = np.array([r[name] for r in rows if r[name] is not None], dtype=np.float64)
        out[name] = {
            "mean": float(values.mean()),
            "std": float(values.std()),
            "median": float(np.median(values)),
            "n": int(values.size),
        }
    ratios = np.array([r["period_ratio"] for r in rows if r["period_ratio"] is not None])
    kept = (np.abs(ratios - 1) <= 0.25).astype(np.float64)
    out["period_kept"] = {
        "mean": float(kept.mean()),
        "std": float(kept.std()),
        "median": float(np.median(kept)),
        "n": int(kept.size),
    }
    return out


def rescore(out: Path, specs) -> tuple[dict, dict, dict]:
    """Scores of the images an earlier run saved in ``out`` (``images_<scale>x_<method>.npz``), its CPU times
    and the images (method -> scale -> uint8 ``[N, S, S, 3]``)."""
    meta = json.loads((out / "results.json").read_text())["meta"]
    results, cpu, images = {}, {}, {}
    for key, seconds in meta["cpu_seconds"].items():
        scale, method = key.split("x/")
        generated = np.load(out / f"images_{scale}x_{method}.npz")["images"]
        images.setdefault(method, {})[int(scale)] = generated
        results[(int(scale), method)] = summarise(generated, specs[: len(generated)])
        cpu[(int(scale), method)] = seconds
    return results, cpu, images


def markdown(results, cpu) -> str:
    lines = [
        "| scale | method | count error | duplicated | position acc | period ratio (median) | period kept | CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (scale, method), scores in results.items():
        cells = [f"{scores[n]['mean']:.2f} ± {scores[n]['std']:.2f}" for n in SCORES[:3]]
        cells.append(f"{scores['period_ratio']['median']:.2f}")
        cells.append(f"{scores['period_kept']['mean']:.2f}")
        lines.append(f"| {scale}x | {method} | " + " | ".join(cells) + f" | {cpu[(scale, method)]:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=64, help="held-out captions")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--guidance", type=float, default=3.0, help="true CFG scale")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS + EXTRA_METHODS + RULE_METHODS)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--figure-index", type=int, default=None, help="caption shown in the figure")
    parser.add_argument("--out", default="outputs/extrapolation", help="folder for results.json, table.md, images")
    parser.add_argument("--figure", default=None, help="PNG path of the figure (default: OUT/figure.png)")
    parser.add_argument(
        "--rescore",
        action="store_true",
        help="recompute the table (and --figure) from the images an earlier run saved in --out",
    )
    args = parser.parse_args(argv)
    try:
        with claimed_output(args.out, args.figure):  # another run writing them now: refused
            return evaluate(parser, args)
    except ConcurrentWriteError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")


def evaluate(parser, args) -> int:
    out = Path(args.out)
    if args.rescore:
        trained = trained_image_size(None, "t2i")
        examples = held_out_examples("t2i", args.count, image_size=trained)
        specs = [SceneSpec.from_dict(e["spec"]) for e in examples]
        results, cpu, images = rescore(out, specs)
        table = markdown(results, cpu)
        (out / "table.md").write_text(table + "\n")
        print(table)
        if args.figure:
            index = args.figure_index if args.figure_index is not None else figure_caption_index(specs)
            extrapolation_figure(images, examples[index]["image"], index, Path(args.figure))
        return 0
    if out.exists() and any(out.iterdir()):
        parser.error(f"--out {out} exists and is not empty; choose another folder")
    out.mkdir(parents=True, exist_ok=True)

    pipe = load_world_pipeline("t2i")
    pipe.set_progress_bar_config(disable=True)
    trained = trained_image_size(None, "t2i")
    tokens = trained // 4  # VAE factor 2, 2x2 packing
    examples = held_out_examples("t2i", args.count, image_size=trained)
    specs = [SceneSpec.from_dict(e["spec"]) for e in examples]
    results, cpu, images = {}, {}, {m: {} for m in ["stock", *args.methods]}
    for scale in args.scales:
        methods = ["stock"] if scale == 1 else list(args.methods)
        for method in methods:
            install_method(pipe, method, (tokens, tokens))
            start = time.process_time()
            generated = generate_at_size(pipe, examples, trained * scale, args.steps, args.guidance, args.batch)
            cpu[(scale, method)] = time.process_time() - start
            images[method][scale] = generated
            results[(scale, method)] = summarise(generated, specs)
            np.savez_compressed(out / f"images_{scale}x_{method}.npz", images=generated)
            print(
                f"{scale}x {method:12s} "
                + "  ".join(f"{n} {results[(scale, method)][n]['mean']:.3f}" for n in SCORES)
                + f"  cpu {cpu[(scale, method)]:.0f}s",
                flush=True,
            )
        if scale == 1 and "dype" in args.methods and args.count >= args.batch:  # 1x: every preset is stock
            install_method(pipe, "dype", (tokens, tokens))
            first = generate_at_size(pipe, examples[: args.batch], trained, args.steps, args.guidance, args.batch)
            identical = bool(np.array_equal(first, images["stock"][1][: args.batch]))
            print(f"1x dype == stock on the first batch: {identical}")
            results[("1", "dype == stock")] = identical
        rules = [m for m in args.methods if "+" in m]
        if scale == 1 and rules and args.count >= args.batch:  # 1x: an attention rule leaves the model stock
            install_method(pipe, rules[0], (tokens, tokens))
            first = generate_at_size(pipe, examples[: args.batch], trained, args.steps, args.guidance, args.batch)
            identical = bool(np.array_equal(first, images["stock"][1][: args.batch]))
            print(f"1x {rules[0]} == stock on the first batch: {identical}")
            results[("1", f"{rules[0]} == stock")] = identical
    install_method(pipe, "stock", (tokens, tokens))
    index = args.figure_index if args.figure_index is not None else figure_caption_index(specs)
    figure_path = Path(args.figure) if args.figure else out / "figure.png"
    extrapolation_figure(images, examples[index]["image"], index, figure_path)
    table = {f"{s}x/{m}": v for (s, m), v in results.items()}
    meta = {
        "count": args.count,
        "steps": args.steps,
        "guidance": args.guidance,
        "trained_px": trained,
        "figure_caption": examples[index]["caption"],
        "cpu_seconds": {f"{s}x/{m}": v for (s, m), v in cpu.items()},
        "cpu_minutes_total": sum(cpu.values()) / 60,
        "threads": torch.get_num_threads(),
    }
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": table}, indent=1))
    (out / "table.md").write_text(markdown({k: v for k, v in results.items() if isinstance(v, dict)}, cpu) + "\n")
    print(markdown({k: v for k, v in results.items() if isinstance(v, dict)}, cpu))
    print(f"CPU minutes: {meta['cpu_minutes_total']:.1f}; figure caption: {meta['figure_caption']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
