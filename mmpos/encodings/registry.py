"""Registry of named encodings: ``create_pe(name, **options)`` and ``list_pes()``, timm-style."""

from __future__ import annotations

import inspect
from typing import Any, Callable, TypeVar

from .base import Capabilities, PEKind, PositionalEncoding

_REGISTRY: dict[str, type[PositionalEncoding]] = {}

E = TypeVar("E", bound=type[PositionalEncoding])


def register_pe(name: str) -> Callable[[E], E]:
    """Class decorator: make ``cls`` reachable as ``create_pe(name, ...)``.

    ``cls`` must say what it is: a :class:`~.base.PEKind` ``kind``, :class:`~.base.Capabilities`
    ``capabilities`` and an ``example_options`` dict (a tiny configuration the registry sweep test builds);
    a ``description`` (one sentence, for ``mmpos list``) is optional (see :func:`pe_description`).
    """

    def wrap(cls: E) -> E:
        if not isinstance(getattr(cls, "kind", None), PEKind):
            raise TypeError(f"{cls.__name__}.kind must be a PEKind, got {getattr(cls, 'kind', None)!r}")
        if not isinstance(getattr(cls, "capabilities", None), Capabilities):
            raise TypeError(f"{cls.__name__}.capabilities must be a Capabilities")
        if not isinstance(getattr(cls, "example_options", None), dict):
            raise TypeError(f"{cls.__name__}.example_options must be a dict of options for a tiny configuration")
        if name in _REGISTRY:
            raise ValueError(f"encoding {name!r} is already registered by {_REGISTRY[name].__name__}")
        _REGISTRY[name] = cls
        cls.pe_name = name
        return cls

    return wrap


def list_pes(kind: str | PEKind | None = None) -> list[str]:
    """Sorted names of registered encodings; ``kind`` filters by a :class:`PEKind` (or its value, ``"rotary"``,
    ``"absolute"``, ``"camera"``, ``"none"``)."""
    if kind is not None:
        kind = PEKind(kind)
    return sorted(n for n, c in _REGISTRY.items() if kind is None or c.kind == kind)


def pe_class(name: str) -> type[PositionalEncoding]:
    """The class registered as ``name``; an unknown name is an error listing the registered ones."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown encoding {name!r}; registered: {list_pes()}")
    return _REGISTRY[name]


def pe_description(name: str) -> str:
    """One sentence on ``name`` for ``mmpos list``: the class's own ``description``, else the first sentence of
    its docstring (an encoding written after docs/adding_an_encoding.md needs nothing more)."""
    cls = pe_class(name)
    own = cls.__dict__.get("description")
    if own:
        return own
    text = " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split())
    sentence = text.split(". ")[0].rstrip(".")
    return f"{sentence}." if sentence and not sentence.startswith("Args") else f"{cls.__name__}."


def pe_capabilities(name: str) -> Capabilities:
    """The capabilities of ``name`` with its default options, without building it."""
    return pe_class(name).capabilities


def pe_options(name: str) -> dict:
    """Option name -> default (``inspect.Parameter.empty`` when required)."""
    params = inspect.signature(pe_class(name)).parameters
    named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {k: p.default for k, p in params.items() if p.kind in named}


def create_pe(name: str, **options: Any) -> PositionalEncoding:
    """Build the encoding ``name``; an unknown or missing option is an error that names it."""
    cls = pe_class(name)
    valid = pe_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(f"create_pe({name!r}): unknown option(s) {unknown}; valid options are {sorted(valid)}")
    missing = sorted(k for k, d in valid.items() if d is inspect.Parameter.empty and k not in options)
    if missing:
        raise TypeError(f"create_pe({name!r}): missing required option(s) {missing}")
    return cls(**options)
