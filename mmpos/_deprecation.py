"""Old import paths kept for one release, each warning (``DeprecationWarning``) with both paths: a module's
``__getattr__`` for moved names (:func:`moved_names`), an import hook for moved submodules (:func:`moved_modules`)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings
from importlib import import_module


def moved_names(old_module: str, new_homes: dict[str, str]):
    """A module ``__getattr__`` for ``old_module``: ``name`` -> ``getattr(import_module(new_homes[name]), name)``,
    with a ``DeprecationWarning`` ("``old.name`` moved to ``new.name``") on every access."""

    def __getattr__(name: str):
        if name not in new_homes:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        new_module, _, new_name = new_homes[name].partition(":")
        warnings.warn(
            f"{old_module}.{name} moved to {new_module}.{new_name or name}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(import_module(new_module), new_name or name)

    return __getattr__


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An import hook for the submodules a package moved: ``import package.old`` (and ``from package import old``,
    ``from package.old import name``) gives the module at its new path, the same object, with a
    ``DeprecationWarning`` naming both paths. ``moves``: old submodule name -> new absolute module name."""

    def __init__(self, package: str, moves: dict[str, str]):
        self.package, self.moves, self._specs = package, dict(moves), {}

    def find_spec(self, fullname, path=None, target=None):
        parent, _, name = fullname.rpartition(".")
        if parent != self.package or name not in self.moves:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new_name = self.moves[spec.name.rpartition(".")[2]]
        warnings.warn(
            f"{spec.name} moved to {new_name}; the old path goes in the next release", DeprecationWarning, stacklevel=2
        )  # the import machinery's frames are skipped: this names the importing line
        module = import_module(new_name)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        """Nothing to run (the module is already imported): only give it back its own ``__spec__``, which the
        import machinery replaced with the old path's."""
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


def moved_modules(package: str, moves: dict[str, str]) -> MovedModules:
    """Install (once per ``package``; a reload replaces it) the :class:`MovedModules` hook of ``package``."""
    sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, MovedModules) and f.package == package)]
    finder = MovedModules(package, moves)
    sys.meta_path.insert(0, finder)  # before the path finders: a stale file at an old path never shadows the move
    return finder
