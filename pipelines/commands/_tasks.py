"""Commands whose sub-commands are tasks (``mmpos train vit``, ``mmpos eval vit``): one parser per task."""

from __future__ import annotations


def register_tasks(subparsers, name: str, help: str, description: str, tasks: dict, run) -> None:
    """``mmpos NAME TASK ARGS``; ``tasks`` maps a task to ``(description, add_arguments, run_task)``."""
    command = subparsers.add_parser(name, help=help, description=description)
    command.set_defaults(func=run)
    choices = command.add_subparsers(dest="target", required=True, metavar="{" + ",".join(tasks) + "}")
    for task_name, (task_description, add_arguments, _) in tasks.items():
        task = choices.add_parser(task_name, help=task_description, description=task_description)
        add_arguments(task)
        task.set_defaults(task_parser=task)


def run_task(tasks: dict, args) -> int:
    return tasks[args.target][2](args, args.task_parser)
