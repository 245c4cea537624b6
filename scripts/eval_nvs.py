"""Novel-view benchmark of the camera encodings on the 3D mini-world (see docs/results.md, "Novel views").

    python scripts/eval_nvs.py data                                  # outputs/nvs/data.pt (train + 3 test sets)
    python scripts/eval_nvs.py train --encoding rayrope --seed 0     # outputs/nvs/checkpoints/rayrope_s0/
    python scripts/eval_nvs.py --checkpoints continued train --encoding rayrope --seed 0 --steps 350 \
        --lr 5e-4 --warmup 20 --init-from checkpoints                 # continue those weights
    python scripts/eval_nvs.py --checkpoints continued report --figure assets/nvs/examples.png   # table, figure

A run's checkpoints are ``checkpoints/<encoding>_s<seed>/checkpoint-<step>/``; ``train --resume`` continues one
(also a ``.pt`` of the earlier layout), ``--overwrite`` replaces it, without either an earlier run is refused. Run
each (encoding, seed) in its own process (or on N processes with ``torchrun``: ``--batch-size`` is per process).
The whole benchmark: ``bash scripts/nvs_benchmark.sh``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

from mmpos._arguments import OneLineErrorParser, positive_int_arg
from mmpos._atomic import check_new_output, claimed_output, written_atomically
from mmpos.training.task_configs import NVS_ENCODING_NAMES, NVSConfig

TEST_SETS = {  # name -> make_triples options for the test scenes (baselines: mmpos.world.nvs_data)
    "test": dict(baseline="train"),
    "wide": dict(baseline="wide"),
    "fisheye": dict(baseline="train", target_lens="unified"),
}


def scene_options(name: str) -> dict:
    from mmpos.world.nvs_data import TRAIN_BASELINE, WIDE_BASELINE

    options = dict(TEST_SETS[name])
    options["baseline_degrees"] = {"train": TRAIN_BASELINE, "wide": WIDE_BASELINE}[options.pop("baseline")]
    return options


def make_data(args):
    import torch

    from mmpos.world.nvs_data import make_triples

    data = {"train": make_triples("train", args.train_scenes, 4)}
    for name in TEST_SETS:
        data[name] = make_triples("test", args.test_scenes, 2, **scene_options(name))
    path = os.path.join(args.out, "data.pt")
    with written_atomically(path) as temporary:
        torch.save(data, temporary)
    print(f"wrote {path}: " + ", ".join(f"{k} {v['images'].shape[0]}" for k, v in data.items()))


def train(args):
    """``mmpos train nvs`` with this script's folder layout (``--init-from``: a checkpoint folder inside --out)."""
    name = f"{args.encoding}_s{args.seed}.pt"
    config = NVSConfig(
        args.encoding,
        os.path.join(args.out, args.checkpoints, name.removesuffix(".pt")),
        os.path.join(args.out, "data.pt"),
        seed=args.seed,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup=args.warmup,
        init_from=os.path.join(args.out, args.init_from, name) if args.init_from else None,
    )
    from mmpos.training.tasks.nvs import run_command

    run_command(config, args.resume, args.overwrite)


def finished_runs(folder):
    """``(name, saved state)`` of every run in a checkpoint folder: run folders (``<name>/checkpoint-<step>/``)
    and ``<name>.pt`` files of the earlier layout (a run folder wins over a file of its name)."""
    from mmpos.training.tasks.nvs import read_run

    names = {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(folder, "*.pt"))}
    names |= {os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(folder, "*", "checkpoint-*"))}
    for name in sorted(names):
        path = os.path.join(folder, name + ".pt")
        yield path, read_run(path)


def report(args):
    results = os.path.join(args.out, "results.json")
    with claimed_output(results, args.figure):  # another report writing them now: refused (ConcurrentWriteError)
        for path in (results, args.figure):  # refused before the work: what it would replace, unless --overwrite
            if path:
                check_new_output(path, args.overwrite, "--figure" if path == args.figure else "--out")
        write_report(args, results)


def write_report(args, results):
    from mmpos._safe_state import load_torch_file
    from mmpos.training.tasks.nvs import evaluate, load_trained

    data = load_torch_file(os.path.join(args.out, "data.pt"))
    rows, models = [], {}
    for path, saved in finished_runs(os.path.join(args.out, args.checkpoints)):
        if saved["step"] < saved["recipe"]["steps"]:
            print(f"skipping unfinished {path}", file=sys.stderr)
            continue
        model = load_trained(path)
        row = dict(
            saved["recipe"],
            total_steps=saved.get("previous_steps", 0) + saved["step"],
            cpu_seconds=saved.get("previous_cpu_seconds", 0.0) + saved["cpu_seconds"],
            final_loss=sum(saved["losses"][-50:]) / 50,
            parameters=sum(p.numel() for p in model.parameters()),
        )
        for name in TEST_SETS:
            row.update({f"{name}_{k}": v for k, v in evaluate(model, data[name]).items()})
        rows.append(row)
        models.setdefault(row["encoding"], model)
        print(json.dumps(row), flush=True)
    rows.append(copy_context_row(data))
    with written_atomically(results, replace=args.overwrite) as temporary, open(temporary, "w") as handle:
        json.dump(rows, handle, indent=1)
    print(markdown_table(rows))
    if args.figure:
        save_figure(models, data, args.figure, replace=args.overwrite)


def copy_context_row(data):
    """A reference row: the nearer-in-azimuth context view returned as the prediction (no model)."""
    import torch

    from mmpos.eval.image_quality import psnr, ssim

    row = dict(encoding="copy context", seed=0, cpu_seconds=0.0, parameters=0)
    for name in TEST_SETS:
        images = data[name]["images"].double()
        centres = data[name]["c2w"][:, :, :3, 3]
        nearer = (centres[:, :2] - centres[:, 2:]).norm(dim=-1).argmin(1)
        guess = images[torch.arange(images.shape[0]), nearer]
        row[f"{name}_psnr"] = psnr(guess, images[:, 2]).mean().item()
        row[f"{name}_ssim"] = ssim(guess, images[:, 2]).mean().item()
    return row


def summary(values, digits):
    import torch

    """``mean ± standard deviation`` over seeds."""
    values = torch.tensor(values, dtype=torch.float64)
    spread = values.std().item() if len(values) > 1 else 0.0
    return f"{values.mean().item():.{digits}f} ± {spread:.{digits}f}"


def markdown_table(rows):
    columns = [f"{name}_{metric}" for name in TEST_SETS for metric in ("psnr", "ssim")]
    lines = [
        "| encoding | seeds | params | steps | CPU min / run | "
        + " | ".join(columns)
        + " | wide - test PSNR | fisheye - test PSNR |",
        "|---" * (7 + len(columns)) + "|",
    ]
    for encoding in (*NVS_ENCODING_NAMES, "copy context"):
        group = [r for r in rows if r["encoding"] == encoding]
        if not group:
            continue
        cells = [summary([r[c] for r in group], 3 if c.endswith("ssim") else 2) for c in columns]
        cells += [summary([r[f"{name}_psnr"] - r["test_psnr"] for r in group], 2) for name in ("wide", "fisheye")]
        minutes = sum(r["cpu_seconds"] for r in group) / len(group) / 60
        first = group[0]
        head = f"| {encoding} | {len(group)} | {first['parameters']} | {first.get('total_steps', 0)} | {minutes:.1f} | "
        lines.append(head + " | ".join(cells) + " |")
    return "\n".join(lines)


def save_figure(models, data, path, count=2, replace=True):
    import torch
    from PIL import Image

    from mmpos.training.tasks.nvs import predict

    rows = []
    for name in ("test", "wide", "fisheye"):
        picked = {k: v[:count] for k, v in data[name].items()}
        panels = [picked["images"][:, 0], picked["images"][:, 1], picked["images"][:, 2]]
        panels += [predict(model, picked) for model in models.values()]
        rows.append(torch.cat([torch.cat(list(p), 1) for p in panels], 2))  # [3, count*S, columns*S]
    grid = torch.cat(rows, 1)
    image = (grid.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    with written_atomically(path, replace=replace) as temporary:  # same suffix: PIL picks the format by it
        Image.fromarray(image).resize((image.shape[1] * 3, image.shape[0] * 3), Image.NEAREST).save(temporary)
    print(f"wrote {path}: columns context 0, context 1, ground truth, " + ", ".join(models))


def main(argv=None):
    parser = OneLineErrorParser(
        prog="eval_nvs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="outputs/nvs")
    parser.add_argument("--checkpoints", default="checkpoints", help="checkpoint folder inside --out")
    commands = parser.add_subparsers(dest="command", required=True)
    data = commands.add_parser("data")
    data.add_argument("--train-scenes", type=int, default=300)
    data.add_argument("--test-scenes", type=int, default=60)
    training = commands.add_parser("train")
    training.add_argument("--encoding", choices=NVS_ENCODING_NAMES, required=True)
    training.add_argument("--seed", type=int, default=0)
    training.add_argument("--steps", type=positive_int_arg, default=450)
    training.add_argument("--batch-size", type=positive_int_arg, default=8)
    training.add_argument("--lr", type=float, default=1e-3)
    training.add_argument("--warmup", type=int, default=50)
    training.add_argument("--init-from", help="continue the weights of the same run in this checkpoint folder")
    training.add_argument(
        "--resume", action="store_true", help="continue the run's newest checkpoint (a run without one starts)"
    )
    training.add_argument("--overwrite", action="store_true", help="replace an earlier run of this encoding and seed")
    reporting = commands.add_parser("report")
    reporting.add_argument("--figure", default=None)
    reporting.add_argument("--overwrite", action="store_true", help="replace --out's results.json and the --figure")
    args = parser.parse_args(argv)
    from mmpos._safe_state import UnsafeStateError
    from mmpos._validation import NonFiniteLossError
    from mmpos.training.scaffold.folders import UnreadableCheckpointError

    try:
        {"data": make_data, "train": train, "report": report}[args.command](args)
    except (UnsafeStateError, FileExistsError, UnreadableCheckpointError, ValueError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")  # a file that is not plain tensors; an output kept
    except NonFiniteLossError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")


if __name__ == "__main__":
    main()
