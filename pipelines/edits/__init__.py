"""Edit methods, registered like encodings: one module per method, one :func:`register_edit` call each.

    from mmpos.pipelines.edits import get_edit, list_edits
    list_edits()                                   # ['band', 'transplant', 'loose']
    method = get_edit("transplant")                # an EditMethod: pipelines, world task, CLI options, demo
    cls = pipeline_for(method, "black-forest-labs/FLUX.1-Fill-dev")   # from the model's model_index.json

A registered method is ``mmpos edit NAME`` (its options, its configs ``configs/edit_NAME[_world].yaml``), runs
on every model whose pipeline class or diffusers family it names, and has its demo section. Adding one:
``docs/adding_an_edit.md``. Light: the method modules import torch and diffusers only when they run.
"""

from __future__ import annotations

import importlib

from .detect import UnsupportedModelError, model_pipeline_keys, pipeline_for, resolve_pipeline
from .method import EditMethod, EditRun, Variant, load_object, run_edit, seeded_generator

__all__ = [
    "EditMethod",
    "EditRun",
    "Variant",
    "UnsupportedModelError",
    "get_edit",
    "list_edits",
    "load_object",
    "model_pipeline_keys",
    "pipeline_for",
    "register_edit",
    "resolve_pipeline",
    "run_edit",
    "seeded_generator",
    "unregister_edit",
]

_REGISTRY: dict[str, EditMethod] = {}
_MODULES = ("band", "transplant", "loose")  # one line per shipped method module (in `mmpos edit --help` order)
_loaded = False


def register_edit(method: EditMethod) -> EditMethod:
    """Add ``method`` to the registry (its name must be new); returns it."""
    if not method.name.isidentifier():
        raise ValueError(
            f"edit method name {method.name!r}: expected a Python identifier (it is a pipeline call keyword)"
        )
    if method.name in _REGISTRY and _REGISTRY[method.name] is not method:
        raise ValueError(f"an edit method named {method.name!r} is already registered")
    if not method.pipelines:
        raise ValueError(f"edit method {method.name!r}: pipelines is empty; expected {{key: 'module:Class'}}")
    _REGISTRY[method.name] = method
    return method


def unregister_edit(name: str) -> None:
    """Remove a method registered at run time (tests, documentation examples)."""
    _REGISTRY.pop(name, None)


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for name in _MODULES:
            importlib.import_module(f"{__name__}.{name}")


def list_edits() -> list[str]:
    """Names of the registered edit methods: the shipped ones in :data:`_MODULES` order (importing a method's
    folder registers it, in whatever order that happens), then the others in registration order."""
    _load()
    shipped = [name for name in _MODULES if name in _REGISTRY]
    return shipped + [name for name in _REGISTRY if name not in shipped]


def get_edit(name: str) -> EditMethod:
    """The registered :class:`EditMethod` ``name``; a ValueError names the known ones."""
    _load()
    if name not in _REGISTRY:
        raise ValueError(f"unknown edit method {name!r}; expected one of {list(_REGISTRY)}")
    return _REGISTRY[name]
