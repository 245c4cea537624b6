"""``mmpos eval TASK``: evaluate trained runs (``vit``: top-1/top-5 at several resolutions, the options of
``scripts/eval_vit.py``; they live with the evaluator, :mod:`mmpos.training.vit_eval_cli`)."""

from __future__ import annotations

from mmpos.training import vit_eval_cli

from ._tasks import register_tasks, run_task

TASKS = {"vit": (vit_eval_cli.EVAL_DESCRIPTION, vit_eval_cli.add_eval_arguments, vit_eval_cli.run_eval)}


def register(subparsers) -> None:
    register_tasks(
        subparsers,
        "eval",
        "evaluate ViTs with mmpos encodings (`mmpos eval vit --help`)",
        "`mmpos eval vit ARGS`: see `mmpos eval vit --help` for the arguments and their defaults.",
        TASKS,
        run,
    )


def run(args) -> int:
    return run_task(TASKS, args)
