"""Command lines of the ViT trainer and evaluator (``scripts/train_vit.py``, ``scripts/eval_vit.py``; ``mmpos train
vit`` and ``mmpos eval vit`` register the same options through :mod:`mmpos.pipelines.commands.train` / ``.eval``).

Parsing imports neither torch nor timm: the trainer is imported by :func:`run_train` / :func:`run_eval`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._arguments import DefaultsHelpFormatter, OneLineErrorParser, positive_int_arg
from .scaffold.folders import RunExistsError, UnreadableCheckpointError, latest_checkpoint
from .vit_config import ConfigError, load_config

USER_ERRORS = (ConfigError, RunExistsError, FileNotFoundError, UnreadableCheckpointError)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", help="YAML config (keys: mmpos.training.vit_config.DEFAULTS; default: those defaults)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key (value parsed as YAML); repeatable (default: none)",
    )
    parser.add_argument("--model", help="timm model name (default: the config's model)")
    parser.add_argument("--pe", help="mmpos encoding (mmpos.list_pes(); default: the config's pe)")
    parser.add_argument(
        "--ape",
        choices=("drop", "keep", "resample"),
        help="pretrained learned APE: drop it, keep it beside the RoPE, or resample it (ape_learned) "
        "(default: the config's ape)",
    )
    parser.add_argument(
        "--train-only", dest="train_only", help="comma list of pe, head, norm, cls (default: the config's train_only)"
    )
    parser.add_argument("--data-dir", dest="data_dir", help="ImageFolder root (default: the config's data_dir)")
    parser.add_argument(
        "--pretrained",
        action="store_true",
        default=None,
        help="start from timm's pretrained weights (default: the config's pretrained)",
    )
    parser.add_argument(
        "--mixed-precision",
        dest="mixed_precision",
        choices=("no", "bf16", "fp16"),
        help="accelerate mixed precision (default: the config's mixed_precision)",
    )
    parser.add_argument("--seed", type=int, help="random seed (default: the config's seed)")


# option dest -> the config key it sets; an option not given (None) keeps the config's value
TRAIN_FLAG_KEYS = {
    "model": "model",
    "pe": "pe",
    "ape": "ape",
    "train_only": "train_only",
    "data_dir": "data_dir",
    "pretrained": "pretrained",
    "mixed_precision": "mixed_precision",
    "seed": "seed",
    "steps": "steps",
    "compile": "compile",
}


def resolve_train_config(args) -> dict:
    """The config a ``train_vit.py`` / ``mmpos train vit`` run uses: ``--config`` (or the defaults) <- ``--set`` <-
    each option of :data:`TRAIN_FLAG_KEYS` that was given, which sets its own key and nothing else."""
    given = {key: getattr(args, dest) for dest, key in TRAIN_FLAG_KEYS.items() if getattr(args, dest, None) is not None}
    return load_config(args.config, args.overrides, **given)


TRAIN_DESCRIPTION = "Fine-tune a timm ViT with an mmpos encoding."
EVAL_DESCRIPTION = (
    "Top-1/top-5 of trained ViT runs at several resolutions; JSON and a PNG plot of accuracy vs resolution."
)


def train_parser(prog: str = "train_vit.py") -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog=prog, description=TRAIN_DESCRIPTION, formatter_class=DefaultsHelpFormatter)
    add_train_arguments(parser)
    return parser


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``train_vit.py`` / ``mmpos train vit``."""
    add_common_arguments(parser)
    parser.add_argument("--output-dir", required=True, help="run folder (refused if it exists, see --resume)")
    parser.add_argument("--resume", action="store_true", help="continue the run from its newest checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="delete the existing run folder first")
    parser.add_argument("--steps", type=positive_int_arg, help="optimizer steps (default: the config's steps)")
    parser.add_argument(
        "--compile", action="store_true", default=None, help="torch.compile the model (default: the config's compile)"
    )
    parser.add_argument("--eval-only", action="store_true", help="evaluate --checkpoint (or the run's newest)")
    parser.add_argument("--checkpoint", help="accelerate checkpoint folder for --eval-only (default: the run's newest)")


def train_main(argv=None, prog: str = "train_vit.py") -> int:
    parser = train_parser(prog)
    return run_train(parser.parse_args(argv), parser)


def run_train(args, parser) -> int:
    """Train (or ``--eval-only``) from parsed ``args``; ``parser`` reports user errors (one line, exit 2)."""
    from .._validation import NonFiniteLossError
    from .scaffold.checkpoint import CheckpointWriteError
    from .tasks.vit import train_vit

    try:
        config = resolve_train_config(args)
        checkpoint = args.checkpoint
        if args.eval_only and checkpoint is None:
            checkpoint = latest_checkpoint(args.output_dir)
            if checkpoint is None:
                raise FileNotFoundError(f"--eval-only: no checkpoint under {args.output_dir}; pass --checkpoint")
        results = train_vit(
            config,
            args.output_dir,
            resume=args.resume,
            overwrite=args.overwrite,
            eval_only=args.eval_only,
            checkpoint=checkpoint,
        )
    except USER_ERRORS as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    except (NonFiniteLossError, CheckpointWriteError) as error:  # not a usage error: exit code 1
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    if is_main_process():  # under torchrun / accelerate launch every rank has the results: rank 0 prints them
        _print_table(results["eval"])
    return 0


def is_main_process() -> bool:
    """Whether this is rank 0 of the run's processes (accelerate's state, set up by the trainer; True alone)."""
    from accelerate import PartialState

    return PartialState().is_main_process


def eval_parser(prog: str = "eval_vit.py") -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog=prog, description=EVAL_DESCRIPTION, formatter_class=DefaultsHelpFormatter)
    add_eval_arguments(parser)
    return parser


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``eval_vit.py`` / ``mmpos eval vit``."""
    parser.add_argument("runs", nargs="+", help="run folders of train_vit.py (config.yaml + checkpoint-<step>/)")
    parser.add_argument("--sizes", type=int, nargs="+", help="resolutions in pixels (default: the config's eval_sizes)")
    parser.add_argument(
        "--scales",
        type=float,
        nargs="+",
        help="or multiples of the training resolution (default: the config's eval_scales)",
    )
    parser.add_argument("--aspects", type=float, nargs="+", help="width / height ratios (default 1)")
    parser.add_argument(
        "--extrapolation",
        nargs="+",
        choices=("none", "pi", "ntk", "yarn"),
        help="position extrapolation methods (default: the config's eval_extrapolation)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key of each run's config.yaml (default: none)",
    )
    parser.add_argument(
        "--out", required=True, help="output folder: eval.json and eval.png are written into it (refused if they exist)"
    )


def eval_main(argv=None, prog: str = "eval_vit.py") -> int:
    parser = eval_parser(prog)
    return run_eval(parser.parse_args(argv), parser)


def run_eval(args, parser) -> int:
    """Evaluate the runs of parsed ``args``; ``parser`` reports user errors (one line, exit 2)."""
    from .tasks.vit import train_vit
    from .vit_eval import plot_results, save_results

    folder = Path(args.out)
    if folder.suffix.lower() in (".json", ".png") or folder.is_file():  # every mmpos --out is a folder
        parser.exit(2, f"{parser.prog}: error: --out {folder}: expected a folder (eval.json and eval.png go in it)\n")
    out = folder / "eval.json"
    all_rows = {}
    try:
        for path in (out, out.with_suffix(".png")):  # the results and their plot
            if path.exists():
                raise RunExistsError(f"--out {folder}: {path} exists; choose a new folder")
        for run in args.runs:
            config = load_config(Path(run) / "config.yaml", args.overrides)
            config.update(
                {
                    k: v
                    for k, v in (
                        ("eval_sizes", args.sizes),
                        ("eval_scales", args.scales),
                        ("eval_aspects", args.aspects),
                        ("eval_extrapolation", args.extrapolation),
                    )
                    if v
                }
            )
            checkpoint = latest_checkpoint(run)
            if checkpoint is None:
                raise FileNotFoundError(f"{run}: no checkpoint-<step> under {run}")
            results = train_vit(config, run, eval_only=True, checkpoint=checkpoint, results_name=None)
            all_rows[f"{Path(run).name}"] = results["eval"]
    except USER_ERRORS as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if not is_main_process():  # every rank evaluated the same runs: rank 0 writes and prints
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    save_results(all_rows, out)
    plot_results(all_rows, out.with_suffix(".png"))
    for name, rows in all_rows.items():
        print(name)
        _print_table(rows)
    return 0


def _print_table(rows) -> None:
    for row in rows:
        top1 = "n/a" if row["top1"] is None else f"{row['top1']:.2f}"
        top5 = (
            "" if row.get("classes", 6) <= 5 else "  top-5 " + ("n/a" if row["top5"] is None else f"{row['top5']:.2f}")
        )
        print(f"  {row['height']}x{row['width']} {row['extrapolation']:>5}: top-1 {top1}{top5}")


if __name__ == "__main__":
    sys.exit(train_main())
