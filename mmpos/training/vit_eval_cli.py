"""The command line of the ViT evaluator (``scripts/eval_vit.py``; ``mmpos eval vit`` registers the same options
through :mod:`mmpos.pipelines.commands.evaluate`): trained runs at several resolutions, aspects and extrapolations.

Parsing imports neither torch nor timm: the evaluator is imported by :func:`run_eval`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._arguments import DefaultsHelpFormatter, OneLineErrorParser
from .scaffold.config import ConfigError, yaml_value
from .scaffold.folders import RunExistsError, UnreadableCheckpointError, latest_checkpoint

USER_ERRORS = (ConfigError, RunExistsError, FileNotFoundError, UnreadableCheckpointError)
EVAL_DESCRIPTION = (
    "Top-1/top-5 of trained ViT runs at several resolutions; JSON and a PNG plot of accuracy vs resolution."
)


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
    from accelerate import PartialState

    from .task_configs import ViTConfig
    from .tasks.vit import print_table, train_vit
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
            changes = dict(parse_override(text) for text in args.overrides)
            changes.update(
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
            config = ViTConfig.from_file(Path(run) / "config.yaml", **{**changes, "out": str(run)})
            checkpoint = latest_checkpoint(run)
            if checkpoint is None:
                raise FileNotFoundError(f"{run}: no checkpoint-<step> under {run}")
            results = train_vit(config, eval_only=True, checkpoint=checkpoint, results_name=None)
            all_rows[f"{Path(run).name}"] = results["eval"]
    except USER_ERRORS as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if not PartialState().is_main_process:  # every rank evaluated the same runs: rank 0 writes and prints
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    save_results(all_rows, out)
    plot_results(all_rows, out.with_suffix(".png"))
    for name, rows in all_rows.items():
        print(name)
        print_table(rows)
    return 0


def parse_override(text: str) -> tuple[str, object]:
    """``"key=value"`` -> ``(key, the value parsed as YAML)``."""
    key, equals, value = text.partition("=")
    if not equals:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    return key.strip(), yaml_value(value)


if __name__ == "__main__":
    sys.exit(eval_main())
