"""Every training task of mmpos, one module each, registered in :data:`TASKS` (torch-free to import).

A task is the model, data and loss trained on the scaffold (:mod:`mmpos.training.scaffold`): ``dit`` and
``camera_adapter`` are :class:`~mmpos.training.scaffold.loop.TrainingTask` subclasses run by its loop; ``vit``,
``world_image``, ``world_video`` and ``nvs`` keep their own update order (timm's schedules and gradient
accumulation; one generator per run or per step, drawing the global batch on every process) and take the
scaffold's backward pass, checkpoints, folders and accelerator.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskEntry:
    """A registered task: its module (under this package), what it trains, and its command line.

    ``config`` / ``task``: for a :class:`~mmpos.training.scaffold.loop.TrainingTask`, its config class (in the
    torch-free :mod:`mmpos.training.task_configs`) and its task class (in ``module``); ``outputs``: what its run
    writes besides the checkpoints (the task class's ``outputs``, here so that the run folder is checked before
    torch loads)."""

    module: str
    summary: str
    script: str
    config: str | None = None
    task: str | None = None
    outputs: tuple[str, ...] = ()


TASKS: dict[str, TaskEntry] = {
    "vit": TaskEntry("vit", "fine-tune a timm ViT with an mmpos encoding", "scripts/train_vit.py"),
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
    "world_image": TaskEntry("world_image", "the mini-world's VAE and image transformers", "scripts/train_world.py"),
    "world_video": TaskEntry("world_video", "the mini-world's video model in stages", "scripts/train_world_video.py"),
    "nvs": TaskEntry("nvs", "the novel-view transformer of the camera encodings", "scripts/eval_nvs.py"),
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
