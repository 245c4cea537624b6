"""Old import paths kept for one release: a module's ``__getattr__`` that imports a moved name from its new home
and warns (``DeprecationWarning``) naming both paths."""
from __future__ import annotations

import warnings
from importlib import import_module


def moved_names(old_module: str, new_homes: dict[str, str]):
    """A module ``__getattr__`` for ``old_module``: ``name`` -> ``getattr(import_module(new_homes[name]), name)``,
    with a ``DeprecationWarning`` ("``old.name`` moved to ``new.name``") on every access."""

    def __getattr__(name: str):
        if name not in new_homes:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        new_module, _, new_name = new_homes[name].partition(":")
        warnings.warn(f"{old_module}.{name} moved to {new_module}.{new_name or name}; the old path goes in the next "
                      "release", DeprecationWarning, stacklevel=2)
        return getattr(import_module(new_module), new_name or name)

    return __getattr__
