"""``mmpos train TASK``: train a task's model (``vit``: fine-tune a timm ViT with an mmpos encoding, the options of
``scripts/train_vit.py``). The task's options live with its trainer (:mod:`mmpos.training.vit_cli`); parsing
them imports neither torch nor timm."""
from __future__ import annotations

from mmpos.training import vit_cli

TASKS = {"vit": (vit_cli.TRAIN_DESCRIPTION, vit_cli.add_train_arguments, vit_cli.run_train)}


def register(subparsers) -> None:
    train = subparsers.add_parser("train", help="fine-tune ViTs with mmpos encodings (`mmpos train vit --help`)",
                                  description="`mmpos train vit ARGS`: see `mmpos train vit --help` for the "
                                  "arguments and their defaults.")
    train.set_defaults(func=run)
    tasks = train.add_subparsers(dest="target", required=True, metavar="{vit}")
    for name, (description, add_arguments, _) in TASKS.items():
        task = tasks.add_parser(name, help=description, description=description)
        add_arguments(task)
        task.set_defaults(task_parser=task)


def run(args) -> int:
    return TASKS[args.target][2](args, args.task_parser)
