"""``mmpos train TASK``: train a registered task's model (:data:`mmpos.training.tasks.TASKS`: ``vit``, ``dit``,
``camera_adapter``, ``world_image``, ``world_video``, ``nvs``), one flag per key of its config class
(:mod:`mmpos.training.task_configs`). Parsing imports neither torch nor timm: the trainer is imported when the
command runs."""

from __future__ import annotations

from mmpos.training.tasks import TASKS

from ._tasks import register_tasks, run_task


def config_command(name: str) -> tuple:
    """``(description, add_arguments, run)`` of the task ``name`` (its config class's flags): a
    ``TrainingTask`` runs on the scaffold's loop, another task through its module's ``run_command``."""
    entry = TASKS[name]

    def add_arguments(parser) -> None:
        from mmpos.training.scaffold.config import add_config_arguments
        from mmpos.training.tasks import task_config

        add_config_arguments(parser, task_config(name))

    def run(args, parser) -> int:
        from mmpos.training.scaffold.config import check_run_of, config_from_args
        from mmpos.training.tasks import task_config

        config = config_from_args(task_config(name), args, parser)  # one line, exit 2, before torch loads
        if entry.task is None:
            from mmpos.training.tasks import run_own_loop

            return run_own_loop(name, config, args.resume, args.overwrite, f"mmpos train {name}")
        check_run_of(config, args, parser, entry.outputs)
        from mmpos.training.scaffold.loop import train_command
        from mmpos.training.tasks import task_module

        task = getattr(task_module(name), entry.task)(config)
        return 1 if train_command(f"mmpos train {name}", task, args.resume, args.overwrite) is None else 0

    return f"{entry.summary} (the options of {entry.script})", add_arguments, run


TASK_COMMANDS = {name: config_command(name) for name in TASKS}


def register(subparsers) -> None:
    register_tasks(
        subparsers,
        "train",
        f"train a registered task's model: {', '.join(TASK_COMMANDS)} (`mmpos train TASK --help`)",
        "`mmpos train TASK ARGS`: see `mmpos train TASK --help` for the arguments and their defaults.",
        TASK_COMMANDS,
        run,
    )


def run(args) -> int:
    return run_task(TASK_COMMANDS, args)
