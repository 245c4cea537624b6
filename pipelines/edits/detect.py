"""Which pipeline of an edit method runs a model: from the model folder's ``model_index.json``.

A model is named by its pipeline keys, most specific first: its pipeline class name (``_class_name``, e.g.
``FluxFillPipeline``), then its diffusers family (``flux``; from the class name via
:func:`~mmpos.integrations.diffusers.families.family_for_pipeline`, else from the transformer's class in the
index). The method's ``pipelines`` entry of the first key it has is the pipeline to load.
"""

from __future__ import annotations

import json
from pathlib import Path


class UnsupportedModelError(ValueError):
    """The model's pipeline class and family are not among an edit method's pipelines."""


def model_index(path) -> dict:
    """``model_index.json`` of a local folder or a hub id (only that file is fetched); ValueError if there is none."""
    index = Path(str(path)) / "model_index.json"
    if index.is_file():
        return read_json_file(index, "a mapping of component names")
    if Path(str(path)).is_dir():
        raise ValueError(
            f"--model {path}: no model_index.json there; expected a diffusers pipeline folder "
            "(save_pretrained), a hub id, or 'world' (the shipped world models)"
        )
    from diffusers import DiffusionPipeline

    try:
        return dict(DiffusionPipeline.load_config(str(path)))
    except OSError as error:
        raise ValueError(unreadable_model_message(path, error)) from None


def read_json_file(path, expected: str) -> dict:
    """A JSON object file of a model folder (``model_index.json``, ``model_card.json``); a ValueError naming
    ``--model`` and the file if it is not UTF-8 JSON holding an object (``expected`` says which)."""
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(
            f"--model {path.parent}: {path.name} is not valid JSON ({error}); expected {expected}"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"--model {path.parent}: {path.name} holds a {type(value).__name__}; expected {expected}")
    return value


OFFLINE_ERRORS = ("OfflineModeIsEnabled",)  # huggingface_hub: HF_HUB_OFFLINE is set
UNREACHABLE_ERRORS = ("LocalEntryNotFoundError", "ConnectionError", "ConnectTimeout", "ReadTimeout", "ConnectError")


def unreadable_model_message(path, error: BaseException) -> str:
    """The one-line message for a ``--model`` whose ``model_index.json`` could not be read: offline
    (``HF_HUB_OFFLINE``) and not in the hub cache, the hub unreachable and not in the cache, or no pipeline there."""
    causes, seen = [], error
    while seen is not None and len(causes) < 16:
        causes.append(type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    if any(name in OFFLINE_ERRORS for name in causes):
        return (
            f"--model {path}: not a local folder, and not in the hub cache while offline (HF_HUB_OFFLINE is set): "
            "download it once with the network on, unset HF_HUB_OFFLINE, or pass a saved pipeline folder"
        )
    if any(name in UNREACHABLE_ERRORS for name in causes):
        return (
            f"--model {path}: not a local folder, not in the hub cache, and the hub could not be reached (no "
            "network?): check the connection or pass a saved pipeline folder"
        )
    return f"--model {path}: no diffusers pipeline there ({error})"


def index_pipeline_keys(index: dict) -> list[str]:
    """``[class name, family]`` of a ``model_index.json`` dict (either may be missing)."""
    from mmpos.integrations.diffusers.families import FAMILIES, family_for_pipeline, list_families

    class_name = str(index.get("_class_name", ""))
    keys = [class_name] if class_name else []
    family = family_for_pipeline(class_name)
    if family is None:  # an mmpos subclass saved under its own name, or a pipeline no family lists
        transformer = (index.get("transformer") or [None, None])[-1]
        list_families()
        family = next(
            (
                f
                for f in FAMILIES.values()
                for c in f.classes
                if transformer and (c if isinstance(c, str) else c.__name__).rpartition(":")[2] == transformer
            ),
            None,
        )
    return keys + ([family.name] if family is not None else [])


def model_pipeline_keys(path) -> list[str]:
    """The pipeline keys of the model at ``path`` (folder or hub id), most specific first."""
    return index_pipeline_keys(model_index(path))


def resolve_pipeline(method, keys, variant=None, where: str = "the model") -> str:
    """The key of ``method.pipelines`` that runs a model with pipeline keys ``keys`` (``variant``: a config
    ``variant`` name forcing one); :class:`UnsupportedModelError` names what the method runs on."""
    chosen = method.variant(variant)
    if chosen is not None:
        return chosen.pipeline
    for key in keys:
        if key in method.pipelines:
            return key
    found = " (family " + keys[1] + ")" if len(keys) > 1 else ""
    what = f"a {keys[0]}{found}" if keys else "a pipeline of no known diffusers family"
    raise UnsupportedModelError(
        f"{where} is {what}; `mmpos edit {method.name}` runs on: "
        f"{', '.join(method.pipelines)} (pipeline classes or diffusers families; families "
        f"{', '.join(method_families(method))})"
    )


def method_families(method) -> list[str]:
    """The diffusers families ``method`` runs on: its family keys, and the families of its pipeline class keys."""
    from mmpos.integrations.diffusers.families import FAMILIES, family_for_pipeline, list_families

    list_families()
    names = []
    for key in method.pipelines:
        family = FAMILIES.get(key) or family_for_pipeline(key)
        if family is not None and family.name not in names:
            names.append(family.name)
    return names


def pipeline_for(method, path, variant=None):
    """The pipeline class of ``method`` for the model at ``path`` (imported now)."""
    return method.pipeline_class(resolve_pipeline(method, model_pipeline_keys(path), variant, f"--model {path}"))
