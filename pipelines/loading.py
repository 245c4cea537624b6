"""Load editing pipelines from a path or hub id; components missing from a saved pipeline are passed as None."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from mmpos._validation import check_choice

from .edits.method import EditMethod
from .kept_pipelines import kept_pipeline

TEXT_COMPONENTS = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def edit_kind(kind: str):
    """The :class:`EditMethod` registered as ``kind``, else None."""
    from .edits import get_edit, list_edits

    return get_edit(kind) if kind in list_edits() else None


def pipeline_class(kind: str, path=None):
    """The pipeline class for ``kind``: an edit method (``band``, ``transplant``, ``loose``, or any registered one: for the model at ``path`` when given, from its ``model_index.json``; else the method's
    first pipeline), ``generate`` (FluxPipeline), ``generate_qwen`` or ``generate:<class name>``."""
    from diffusers import FluxPipeline, QwenImagePipeline

    method = edit_kind(kind)
    if method is not None:
        from .edits import pipeline_for

        return method.pipeline_class(next(iter(method.pipelines))) if path is None else pipeline_for(method, path)
    classes = {"generate": FluxPipeline, "generate_qwen": QwenImagePipeline}
    if kind.startswith(FAMILY_KIND):  # the stock pipeline of a registered family, by class name
        import diffusers

        return getattr(diffusers, kind[len(FAMILY_KIND) :])
    from .edits import list_edits

    check_choice("pipeline kind", kind, (*classes, *list_edits()))
    return classes[kind]


FAMILY_KIND = "generate:"  # + the pipeline class name: text-to-image with any registered family's pipeline


GENERATE_KINDS = {"FluxPipeline": "generate", "QwenImagePipeline": "generate_qwen"}


def generate_kind(path) -> str:
    """``"generate"`` (FluxPipeline) or ``"generate_qwen"`` (QwenImagePipeline), from the saved pipeline's
    ``model_index.json`` (a local folder, or the hub's file: only that file is fetched)."""
    from diffusers import DiffusionPipeline

    from .edits.detect import read_json_file, unreadable_model_message

    index = Path(str(path)) / "model_index.json"
    try:
        config = read_json_file(index, "a mapping of component names") if index.is_file() else None
        class_name = (config or DiffusionPipeline.load_config(path)).get("_class_name")
    except OSError as err:
        raise ValueError(unreadable_model_message(path, err)) from None
    if class_name in GENERATE_KINDS:
        return GENERATE_KINDS[class_name]
    from mmpos.integrations.diffusers.families import FAMILIES, family_for_pipeline

    family = family_for_pipeline(str(class_name))
    if family is None or family.time_axis is not None:
        images = sorted({p for f in FAMILIES.values() if f.time_axis is None for p in f.pipelines})
        video = " (a video pipeline: see `mmpos generate video`)" if family is not None else ""
        raise ValueError(
            f"--model {path}: a {class_name} pipeline{video}; `mmpos generate` runs the image pipelines "
            f"of the registered diffusers families: {', '.join(images)}"
        )
    return FAMILY_KIND + class_name


def missing_components(path, cls=None) -> dict:
    """``{name: None}`` for the components a local saved pipeline does not have: text components absent or saved
    as null, and any other component saved as null (e.g. Qwen-Image-Edit's ``processor``, for tiny models); with
    ``cls``, only those its ``__init__`` takes (no warning about unexpected keywords)."""
    index = Path(path) / "model_index.json"
    if not index.is_file():
        return {}
    from .edits.detect import read_json_file

    entries = read_json_file(index, "a mapping of component names")
    saved = [name for name, entry in entries.items() if isinstance(entry, list) and len(entry) == 2]
    names = dict.fromkeys([*TEXT_COMPONENTS, *saved])
    missing = {name: None for name in names if (entries.get(name) or [None, None])[0] is None}
    if cls is None:
        return missing
    import inspect

    accepted = inspect.signature(cls.__init__).parameters
    return {name: value for name, value in missing.items() if name in accepted}


WORLD = "world"  # --model world: the shipped world model of the command's task
WORLD_TASK_OF_KIND = {"generate": "t2i"}  # edit methods: their EditMethod.world_task (or variant's)


def world_task_of(kind: str) -> str:
    """The world model task (``t2i``, ``fill``, ``kontext``) that runs ``kind``; ValueError otherwise."""
    method = edit_kind(kind)
    if method is not None:
        return method.world_task
    if kind not in WORLD_TASK_OF_KIND:
        from .edits import list_edits

        raise ValueError(
            f"--model world: no world model runs {kind!r}; expected one of "
            f"{sorted({*WORLD_TASK_OF_KIND, *list_edits()})}"
        )
    return WORLD_TASK_OF_KIND[kind]


def model_path(kind: str, model) -> str:
    """``model``, or for ``"world"`` the shipped world model folder that runs ``kind`` (``assets/world-<task>``)."""
    if str(model) != WORLD:
        return str(model)
    from mmpos.models.world.image import DEFAULT_ASSETS

    return str(DEFAULT_ASSETS / f"world-{world_task_of(kind)}")


def is_world_model(model) -> bool:
    """``"world"``, or a local pipeline folder whose text encoder is the world's (:mod:`mmpos.models.world.text`)."""
    index = Path(str(model)) / "model_index.json"
    return str(model) == WORLD or (index.is_file() and '"mmpos.models.world.text"' in index.read_text())


def world_image_size(path) -> int:
    """The image side a world model folder was trained at (its ``model_card.json``; 32 when it does not say)."""
    card = Path(path) / "model_card.json"
    if not card.is_file():
        return 32
    from .edits.detect import read_json_file

    side = read_json_file(card, "a model card").get("data", {}).get("image_size")
    if isinstance(side, bool) or not isinstance(side, int) or side < 1:
        raise ValueError(f"--model {path}: {card.name} data.image_size={side!r}; expected a positive integer")
    return side


@dataclass(frozen=True)
class ModelRef:
    """``--model`` resolved once and passed along a run (rather than asked again at each step).

    Attributes:
        given: the model as the user or the config named it (``"world"``, a folder, a hub id).
        path: what loads: the folder or hub id; for ``"world"`` the shipped world model folder of the command's task.
        is_world: a world model (``"world"`` or a folder with the world's text encoder, :func:`is_world_model`).
        side: the image side a world model was trained at (:func:`world_image_size`); None for other models.
    """

    given: str
    path: str
    is_world: bool
    side: int | None


def model_ref(kind: str, model) -> ModelRef:
    """``model`` (``--model`` or the config's ``model``) resolved for ``kind`` (``generate``, an edit method)."""
    return _resolved(model, model_path(kind, model))


def edit_model_ref(method: EditMethod, config) -> ModelRef:
    """``config["model"]`` resolved for ``method`` (``world``: the shipped world model of the config's variant)."""
    return _resolved(config["model"], model_folder(method, config))


def _resolved(model, path: str) -> ModelRef:
    world = is_world_model(model)
    return ModelRef(str(model), path, world, world_image_size(path) if world else None)


def load_pipeline(kind: str, path, dtype: str = "bfloat16", device: str | None = None):
    """``from_pretrained`` of the pipeline for ``kind`` (an edit method, generate, generate_qwen)
    from ``path`` (a pipeline folder, a hub id, or ``"world"``: the shipped world model); an edit method's class
    follows the model (:func:`mmpos.pipelines.edits.pipeline_for`). A local folder without ``model_index.json``,
    a model the method does not run on, or a path that cannot be loaded, raises ValueError."""
    check_choice("dtype", dtype, tuple(DTYPES))
    path = model_path(kind, path)
    check_pipeline_folder(path)
    return load_pipeline_class(pipeline_class(kind, path if edit_kind(kind) else None), path, dtype, device)


def check_pipeline_folder(path) -> None:
    if Path(path).is_dir() and not (Path(path) / "model_index.json").is_file():
        raise ValueError(
            f"--model {path}: no model_index.json there; expected a diffusers pipeline folder "
            "(save_pretrained), a hub id, or 'world' (the shipped world models)"
        )


def load_pipeline_class(cls, path, dtype: str = "bfloat16", device: str | None = None):
    """``cls.from_pretrained(path)`` in ``dtype`` (text components a local folder lacks passed as None), moved to
    ``device`` (the one already loaded inside :func:`~.kept_pipelines.keep_pipelines_loaded`); ValueError (one
    line) when it cannot be loaded."""
    check_choice("dtype", dtype, tuple(DTYPES))
    check_pipeline_folder(path)
    from mmpos.models.world.image import dtype_keyword, import_named_modules, world_text_encoders_accepted

    import_named_modules(path)  # a local folder's mmpos components (a hub id: nothing to do here)

    def load():
        try:
            with world_text_encoders_accepted():
                pipe = cls.from_pretrained(path, **{dtype_keyword(cls): DTYPES[dtype]}, **missing_components(path, cls))
        except OSError as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(f"--model {path}: cannot load a {cls.__name__} ({reason})") from None
        return pipe if device is None else pipe.to(device)

    return kept_pipeline(cls, path, dtype, device, load)  # load() unless mmpos app keeps it loaded


def world_task(method: EditMethod, config) -> str:
    """The world model (``t2i``, ``fill``, ``kontext``) ``method`` runs on with ``--model world``."""
    return method.world_task_for(config.get("variant"))


def model_folder(method: EditMethod, config) -> str:
    """``config["model"]``, or for ``world`` the shipped world model folder the method runs on."""

    if str(config["model"]) != WORLD:
        return str(config["model"])
    from mmpos.models.world.image import DEFAULT_ASSETS

    return str(DEFAULT_ASSETS / f"world-{world_task(method, config)}")


def input_side(config, model: ModelRef) -> int | None:
    """The side input images are resized to: the config's ``image_size`` (``auto``: the ``model``'s model card's),
    None for configs without one (FLUX.1: the image's own size on the token grid)."""
    side = config.get("image_size")
    if side == "auto":
        return model.side if model.side is not None else world_image_size(model.path)
    return None if side is None else int(side)


def resolve_model(method: EditMethod, config, model: ModelRef | None = None):
    """``(folder or hub id, pipeline class)`` for ``config["model"]`` (resolved as ``model`` when given); sets
    ``config["variant"]`` to the variant the model runs (band: ``flux`` or ``kontext``) when the method has variants.
    ValueError: one line."""
    from .edits.detect import model_pipeline_keys, resolve_pipeline

    path = model_folder(method, config) if model is None else model.path
    key = resolve_pipeline(method, model_pipeline_keys(path), config.get("variant"), f"--model {path}")
    if method.variants:
        config["variant"] = next(
            (name for name, v in method.variants.items() if v.pipeline == key), config.get("variant", "auto")
        )
    return path, method.pipeline_class(key)


def load_edit_pipeline(method: EditMethod, config, model: ModelRef | None = None):
    """The method's pipeline for ``config["model"]`` (resolved as ``model`` when given; saying which model, class,
    device and dtype), with
    ``config["extrapolate"]``'s schedule installed under the edit (``set_pe``); a model that cannot be loaded
    ends the command (one line, exit code 2)."""
    from .extrapolate import install_extrapolation, parse_extrapolate, parse_rules

    setting = config["extrapolate"]
    if parse_rules(str(setting["preset"])):
        print(
            f"mmpos edit {method.name}: error: --extrapolate {setting['preset']}: attention rules are for "
            "mmpos generate (the edits' processors sit above them; not verified under an edit)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    try:
        path, cls = resolve_model(method, config, model)
        print(f"model: {path} ({cls.__name__}), device {config['device']}, dtype {config['dtype']}")
        pipe = load_pipeline_class(cls, path, config["dtype"], config["device"])
    except ValueError as error:
        print(f"mmpos edit {method.name}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    installed = install_extrapolation(
        pipe, parse_extrapolate(str(setting["preset"])), setting["train_size"], setting.get("options")
    )
    if installed["schedules"] is not None:
        setting["installed"] = installed
        print(f"extrapolation: {json.dumps(installed)}")
    return pipe
