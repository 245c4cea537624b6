"""Training workflows built on the public mmpos API (timm conversion, the mini-world data).

One scaffold (:mod:`.scaffold`: the loop and the one backward pass, ``checkpoint-<step>/`` checkpoints and resume,
the config style, run folders, Ctrl-C, the accelerator and N processes) and one module per task
(:mod:`.tasks`: ``vit``, ``dit``, ``camera_adapter``, ``world_image``, ``world_video``, ``nvs``; registered in
:data:`.tasks.TASKS`, which ``mmpos train TASK`` reads).

The exports are loaded on first use, so a task's config (:mod:`.task_configs`) is read without torch."""

from importlib import import_module

_EXPORTS = {
    "ViTConfig": (".task_configs", "ViTConfig"),
    "evaluate_resolutions": (".vit_eval", "evaluate_resolutions"),
    "plot_results": (".vit_eval", "plot_results"),
    "build_vit": (".vit_model", "build_vit"),
    "freeze_except": (".vit_model", "freeze_except"),
    "train_vit": (".tasks.vit", "train_vit"),
}
__all__ = [
    "ViTConfig",
    "build_vit",
    "evaluate_resolutions",
    "freeze_except",
    "plot_results",
    "train_vit",
]


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(import_module(module, __name__), attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
