"""``mmpos eval TASK``: evaluate trained runs (``vit``: top-1/top-5 at several resolutions, the options of
``scripts/eval_vit.py``; they live with the evaluator, :mod:`mmpos.training.vit_cli`)."""
from __future__ import annotations

from mmpos.training import vit_cli

TASKS = {"vit": (vit_cli.EVAL_DESCRIPTION, vit_cli.add_eval_arguments, vit_cli.run_eval)}


def register(subparsers) -> None:
    evaluate = subparsers.add_parser("eval", help="evaluate ViTs with mmpos encodings (`mmpos eval vit --help`)",
                                     description="`mmpos eval vit ARGS`: see `mmpos eval vit --help` for the "
                                     "arguments and their defaults.")
    evaluate.set_defaults(func=run)
    tasks = evaluate.add_subparsers(dest="target", required=True, metavar="{vit}")
    for name, (description, add_arguments, _) in TASKS.items():
        task = tasks.add_parser(name, help=description, description=description)
        add_arguments(task)
        task.set_defaults(task_parser=task)


def run(args) -> int:
    return TASKS[args.target][2](args, args.task_parser)
