"""``mmpos train TASK``: train a task's model (``vit``: fine-tune a timm ViT with an mmpos encoding, the options of
``scripts/train_vit.py``). The task's options live with its trainer (:mod:`mmpos.training.vit_cli`); parsing
them imports neither torch nor timm."""

from __future__ import annotations

from mmpos.training import vit_cli

from ._tasks import register_tasks, run_task

TASKS = {"vit": (vit_cli.TRAIN_DESCRIPTION, vit_cli.add_train_arguments, vit_cli.run_train)}


def register(subparsers) -> None:
    register_tasks(
        subparsers,
        "train",
        "fine-tune ViTs with mmpos encodings (`mmpos train vit --help`)",
        "`mmpos train vit ARGS`: see `mmpos train vit --help` for the arguments and their defaults.",
        TASKS,
        run,
    )


def run(args) -> int:
    return run_task(TASKS, args)
