"""The package's import structure: layers only import downward, and no module-level import cycle exists.

Layers, lowest first: validation helpers; the three parts of an encoding (``coords``, ``spectrum``, ``ops``) and
camera geometry (``camera``); named encodings (``encodings``); what plugs them into models (``integrations``,
``models``, ``viz``); the applications (``world``, ``training``, ``demo``, and ``pipelines``, installed as
``mmpos.pipelines``); on top, the command tree (``mmpos.pipelines.commands``, the ``mmpos.cli`` console script that
aliases it, and the deprecated old CLI paths). A module may import its own layer or lower ones, never a higher one,
not even lazily; and no import cycle runs through a command-line module, not even through lazy imports.
"""
import ast
from pathlib import Path

import mmpos

SOURCE_ROOT = Path(mmpos.__file__).resolve().parent.parent
LAYERS = {
    "_validation": 0, "_atomic": 0, "_arguments": 0, "_deprecation": 0, "_safe_state": 0, "_per_thread": 0,
    "_camera_motions": 0,
    "coords": 1, "spectrum": 1, "ops": 1, "camera": 1,
    "encodings": 2, "__init__": 2,
    "world": 3,
    "integrations": 4, "models": 4, "viz": 4,
    "training": 5, "eval": 5, "demo": 5, "pipelines": 5,
    "cli": 6,
}
# upward imports still to remove (each module -> the higher package it imports); an entry that no longer holds fails
STILL_UPWARD = {
    ("mmpos.world.canvas", "mmpos.pipelines"),
    ("mmpos.world.edit_runs", "mmpos.models"), ("mmpos.world.edit_runs", "mmpos.pipelines"),
    ("mmpos.world.sources", "mmpos.models"), ("mmpos.world.sources", "mmpos.pipelines"),
    ("mmpos.world.tokenizer", "mmpos.models"),
}
COMMAND_TREE = "mmpos.pipelines.commands"
OLD_CLI_PATHS = ("mmpos.pipelines.cli", "mmpos.pipelines.video_cli", "mmpos.pipelines.world_video_cli")  # aliases
COMMAND_LAYER = 6


def package_modules() -> dict[str, Path]:
    """``mmpos.*`` module name -> source file (``pipelines/`` under its installed name ``mmpos.pipelines``)."""
    modules = {}
    for folder, prefix in ((SOURCE_ROOT / "mmpos", "mmpos"), (SOURCE_ROOT / "pipelines", "mmpos.pipelines")):
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((prefix,) + parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def imported_names(path: Path, module: str, top_level_only: bool) -> list[str]:
    """Absolute names ``module`` imports: ``pkg`` and ``pkg.name`` for ``from pkg import name``."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in (tree.body if top_level_only else ast.walk(tree)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return [n for n in names if n == "mmpos" or n.startswith("mmpos.")]


def layer_of(module: str) -> int | None:
    if module == COMMAND_TREE or module.startswith(COMMAND_TREE + ".") or module in OLD_CLI_PATHS:
        return COMMAND_LAYER
    parts = module.split(".")
    return LAYERS.get(parts[1] if len(parts) > 1 else "__init__")


def test_every_part_of_the_package_has_a_layer():
    parts = {name.split(".")[1] for name in package_modules() if "." in name}
    assert parts <= set(LAYERS), f"add these to LAYERS: {sorted(parts - set(LAYERS))}"


def test_no_module_imports_a_higher_layer():
    upward, known = [], set()
    for module, path in package_modules().items():
        for name in imported_names(path, module, top_level_only=False):
            if layer_of(name) is not None and layer_of(name) > layer_of(module):
                if (module, ".".join(name.split(".")[:2])) in STILL_UPWARD:
                    known.add((module, ".".join(name.split(".")[:2])))
                else:
                    upward.append(f"{module} -> {name}")
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))
    assert known == STILL_UPWARD, f"remove from STILL_UPWARD: {sorted(STILL_UPWARD - known)}"


def import_graph(top_level_only: bool) -> dict[str, set[str]]:
    """``module -> modules it imports`` over the package (``from pkg import function`` counted as ``pkg``)."""
    modules = package_modules()
    edges = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(path, module, top_level_only=top_level_only):
            while name and name not in modules:  # `from pkg import function` -> pkg
                name = name.rpartition(".")[0]
            # a package imported by its own submodule is already (being) initialised: not a cycle to report
            if name and name != module and not module.startswith(name + "."):
                targets.add(name)
        edges[module] = targets
    return edges


def is_command_line_module(module: str) -> bool:
    """The command tree, the console script, the old CLI paths and any other ``cli`` / ``*_cli`` module."""
    last = module.rpartition(".")[2]
    return layer_of(module) == COMMAND_LAYER or last == "cli" or last.endswith("_cli")


def test_no_module_level_import_cycle():
    cycles = _cycles(import_graph(top_level_only=True))
    assert not cycles, "module-level import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_cycle_through_a_command_line_module_even_lazily():
    """A cycle of function-level imports (``mmpos.cli -> pipelines.cli -> mmpos.cli``, ``mmpos.cli <->
    training.vit_cli``, ``pipelines.cli <-> pipelines.generate``) works until someone moves an import to the top."""
    cycles = [c for c in _cycles(import_graph(top_level_only=False)) if any(map(is_command_line_module, c))]
    assert not cycles, "import cycles through the command line:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_library_does_not_import_the_command_tree():
    """Only the command tree itself, the ``mmpos.cli`` console script and the old CLI paths import it."""
    importers = sorted(f"{module} -> {name}" for module, path in package_modules().items()
                       for name in imported_names(path, module, top_level_only=False)
                       if (name == COMMAND_TREE or name.startswith(COMMAND_TREE + "."))
                       and layer_of(module) != COMMAND_LAYER and module != "mmpos.cli")
    assert not importers, "the library imports the command tree:\n" + "\n".join(importers)


def test_every_command_is_a_module_of_the_tree_with_register_and_run():
    from mmpos.pipelines import commands

    for command in commands.COMMANDS:
        assert command.__name__.startswith(COMMAND_TREE + "."), command
        assert callable(command.register) and callable(command.run), command.__name__


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_checks_catch_a_cycle_and_an_upward_import(tmp_path):
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    source = tmp_path / "x.py"
    source.write_text("from ..pipelines import band\n\ndef f():\n    from mmpos.world import demo\n")
    names = imported_names(source, "mmpos.encodings.x", top_level_only=False)
    assert layer_of(names[0]) == 5 and "mmpos.world.demo" in names
    assert imported_names(source, "mmpos.encodings.x", top_level_only=True) == ["mmpos.pipelines",
                                                                                "mmpos.pipelines.band"]
