"""Every training task of mmpos, one module each, registered in :data:`TASKS` (torch-free to import).

A task is the model, data and loss trained on the scaffold (:mod:`mmpos.training.scaffold`): ``dit`` and
``camera_adapter`` are :class:`~mmpos.training.scaffold.loop.TrainingTask` subclasses run by its loop; ``vit``,
``world_image``, ``world_video`` and ``nvs`` keep their own update order (timm's schedules and gradient
accumulation; one generator per run or per step, drawing the global batch on every process) and take the
scaffold's backward pass, checkpoints, folders and accelerator. Every task has a config class in
:mod:`mmpos.training.task_configs` (one dataclass style, torch-free) and is ``mmpos train TASK``; a task with its
own update order runs through its module's ``run_command(config, resume, overwrite)`` (:func:`run_own_loop`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskEntry:
    """A registered task: its module (under this package), what it trains, and its command line.

    ``config``: its config class (in the torch-free :mod:`mmpos.training.task_configs`); ``task``: for a
    :class:`~mmpos.training.scaffold.loop.TrainingTask`, its task class (in ``module``; without one the module's
    ``run_command`` runs it); ``outputs``: what its run writes besides the checkpoints (the task class's
    ``outputs``, here so that the run folder is checked before torch loads)."""

    module: str
    summary: str
    script: str
    config: str | None = None
    task: str | None = None
    outputs: tuple[str, ...] = ()


TASKS: dict[str, TaskEntry] = {
    "vit": TaskEntry("vit", "fine-tune a timm ViT with an mmpos encoding", "scripts/train_vit.py", "ViTConfig"),
    "dit": TaskEntry(
        "dit",
        "the reference DiT, class-conditional diffusion",
        "scripts/train_dit.py",
        "DiTConfig",
        "DiTTask",
        ("model", "model_ema", "samples.png"),
    ),
    "camera_adapter": TaskEntry(
        "camera_adapter",
        "a camera adapter on a frozen Wan transformer",
        "scripts/train_camera_adapter.py",
        "CameraAdapterConfig",
        "CameraAdapterTask",
    ),
    "world_image": TaskEntry(
        "world_image", "the mini-world's VAE and image transformers", "scripts/train_world.py", "WorldImageConfig"
    ),
    "world_video": TaskEntry(
        "world_video", "the mini-world's video model in stages", "scripts/train_world_video.py", "WorldVideoConfig"
    ),
    "nvs": TaskEntry("nvs", "the novel-view transformer of the camera encodings", "scripts/eval_nvs.py", "NVSConfig"),
}


def task_module(name: str):
    """The module of the registered task ``name`` (imported now: torch comes with it)."""
    from importlib import import_module

    if name not in TASKS:
        raise KeyError(f"unknown training task {name!r}; registered: {', '.join(TASKS)}")
    return import_module(f"{__name__}.{TASKS[name].module}")


def task_config(name: str):
    """The config class of the scaffold task ``name`` (torch-free)."""
    from .. import task_configs

    return getattr(task_configs, TASKS[name].config)


def run_own_loop(name: str, config, resume: str | None, overwrite: bool, prog: str) -> int:
    """Run ``config`` with the task module's ``run_command`` (the tasks with their own update order): an error of
    the user's (a value, a folder, a checkpoint that cannot be read) is one line and exit code 2 (``SystemExit``),
    a non-finite loss or a checkpoint that could not be written (a full disk) one line and 1. ``resume``: ``"latest"`` (these tasks continue their newest checkpoint)."""
    from ..._arguments import user_error

    if resume not in (None, "latest"):
        raise user_error(prog, f"--resume {resume}: {name} continues its newest checkpoint; pass --resume alone")
    module = task_module(name)
    from ..._validation import NonFiniteLossError
    from ..scaffold.checkpoint import CheckpointWriteError

    try:
        return module.run_command(config, resume is not None, overwrite)
    except (NonFiniteLossError, CheckpointWriteError) as error:  # not the user's: exit code 1
        print(f"{prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as error:  # a config key, a folder, a checkpoint refused (unreadable, unsafe)
        raise user_error(prog, error) from None
