"""Loading an edit method's pipeline for ``mmpos edit``: ``--model`` (a folder, a hub id, or ``world``) -> its
pipeline keys -> the method's pipeline class, with the config's extrapolation installed under the edit."""

from __future__ import annotations

import json
import sys

from .base import EditMethod


def world_task(method: EditMethod, config) -> str:
    """The world model (``t2i``, ``fill``, ``kontext``) ``method`` runs on with ``--model world``."""
    return method.world_task_for(config.get("variant"))


def model_folder(method: EditMethod, config) -> str:
    """``config["model"]``, or for ``world`` the shipped world model folder the method runs on."""
    from ..loading import WORLD

    if str(config["model"]) != WORLD:
        return str(config["model"])
    from mmpos.models.world.image import DEFAULT_ASSETS

    return str(DEFAULT_ASSETS / f"world-{world_task(method, config)}")


def input_side(config, method: EditMethod) -> int | None:
    """The side input images are resized to: the config's ``image_size`` (``auto``: the world model card's), None
    for configs without one (FLUX.1: the image's own size on the token grid)."""
    side = config.get("image_size")
    if side == "auto":
        from ..loading import world_image_size

        return world_image_size(model_folder(method, config))
    return None if side is None else int(side)


def resolve_model(method: EditMethod, config):
    """``(folder or hub id, pipeline class)`` for ``config["model"]``; sets ``config["variant"]`` to the variant
    the model runs (band: ``flux`` or ``kontext``) when the method has variants. ValueError: one line."""
    from .detect import model_pipeline_keys, resolve_pipeline

    path = model_folder(method, config)
    key = resolve_pipeline(method, model_pipeline_keys(path), config.get("variant"), f"--model {path}")
    if method.variants:
        config["variant"] = next(
            (name for name, v in method.variants.items() if v.pipeline == key), config.get("variant", "auto")
        )
    return path, method.pipeline_class(key)


def load_edit_pipeline(method: EditMethod, config):
    """The method's pipeline for ``config["model"]`` (saying which model, class, device and dtype), with
    ``config["extrapolate"]``'s schedule installed under the edit (``set_pe``); a model that cannot be loaded
    ends the command (one line, exit code 2)."""
    from ..extrapolate import install_extrapolation, parse_extrapolate
    from ..loading import load_pipeline_class

    try:
        path, cls = resolve_model(method, config)
        print(f"model: {path} ({cls.__name__}), device {config['device']}, dtype {config['dtype']}")
        pipe = load_pipeline_class(cls, path, config["dtype"], config["device"])
    except ValueError as error:
        print(f"mmpos edit {method.name}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    setting = config["extrapolate"]
    installed = install_extrapolation(
        pipe, parse_extrapolate(str(setting["preset"])), setting["train_size"], setting.get("options")
    )
    if installed["schedules"] is not None:
        setting["installed"] = installed
        print(f"extrapolation: {json.dumps(installed)}")
    return pipe
