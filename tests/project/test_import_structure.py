"""The package's import structure: layers only import downward, and no import cycle exists, not even lazily.

Layers, lowest first: validation helpers; the three parts of an encoding (``coords``, ``spectrum``, ``ops``) and
camera geometry (``camera``); named encodings (``encodings``); the mini-world as data (``world``: scenes, renders,
edit pairs, datasets); what plugs encodings into models and the models themselves (``integrations``, ``models``,
including the world's models, ``viz``); training and evaluation (``training``, ``eval``); the application
(``pipelines``, installed as ``mmpos.pipelines``, with the world's demo and exports, and ``demo``); on top, the
command tree (``mmpos.pipelines.commands`` and the ``mmpos.cli`` console script that aliases it). A module may import its own layer or lower ones, never a higher one, not even lazily (imports of
``mmpos.pipelines`` count like any other, however they are written); and no two modules import each other, not
even through function-level imports.
"""

import ast
from pathlib import Path

import mmpos

SOURCE_ROOT = Path(mmpos.__file__).resolve().parent.parent
LAYERS = {
    "_validation": 0,
    "_atomic": 0,
    "_arguments": 0,
    "_safe_state": 0,
    "_per_thread": 0,
    "_camera_motions": 0,
    "coords": 1,
    "spectrum": 1,
    "ops": 1,
    "camera": 1,
    "encodings": 2,
    "__init__": 2,
    "world": 3,
    "integrations": 4,
    "models": 4,
    "viz": 4,
    "training": 5,
    "eval": 5,
    "pipelines": 6,
    "demo": 6,
    "cli": 7,
}
# upward imports still to remove, module -> the higher package it imports; an entry that no longer holds fails, so
# the set only shrinks. Empty: no module imports a higher layer (the last one, the camera adapter's training task
# reading its clips, lens augmentation and tiny Wan from `pipelines/`, went with issue 26 item 3)
STILL_UPWARD: set[tuple[str, str]] = set()
COMMAND_TREE = "mmpos.pipelines.commands"
COMMAND_LAYER = 7


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
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    names = [f"mmpos.{n}" if n == "pipelines" or n.startswith("pipelines.") else n for n in names]  # its folder name
    return [n for n in names if n == "mmpos" or n.startswith("mmpos.")]


def layer_of(module: str) -> int | None:
    if module == COMMAND_TREE or module.startswith(COMMAND_TREE + "."):
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


def test_no_module_level_import_cycle():
    cycles = _cycles(import_graph(top_level_only=True))
    assert not cycles, "module-level import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_cycle_even_lazily():
    """A cycle of function-level imports (``timm.convert <-> timm.restore``, ``world.demo <-> world.video_demo``,
    ``pipelines.cli <-> pipelines.generate``) works until someone moves an import to the top."""
    cycles = _cycles(import_graph(top_level_only=False))
    assert not cycles, "import cycles (function-level imports included):\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_library_does_not_import_the_command_tree():
    """Only the command tree itself, the ``mmpos.cli`` console script and the old CLI paths import it."""
    importers = sorted(
        f"{module} -> {name}"
        for module, path in package_modules().items()
        for name in imported_names(path, module, top_level_only=False)
        if (name == COMMAND_TREE or name.startswith(COMMAND_TREE + "."))
        and layer_of(module) != COMMAND_LAYER
        and module != "mmpos.cli"
    )
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
    source.write_text(
        "from ..pipelines import band\n\ndef f():\n    from mmpos.world import demo\n    import pipelines.loading\n"
    )
    names = imported_names(source, "mmpos.encodings.x", top_level_only=False)
    assert layer_of(names[0]) == 6 and "mmpos.world.demo" in names and "mmpos.pipelines.loading" in names
    assert imported_names(source, "mmpos.encodings.x", top_level_only=True) == [
        "mmpos.pipelines",
        "mmpos.pipelines.band",
    ]


def test_no_upward_import_is_exempt():
    """The exemption list is empty and stays so: a new upward import is a failure, not a new entry."""
    assert STILL_UPWARD == set()


def benchmark_test_imports(path: Path) -> list[str]:
    """What ``path`` (a benchmark) takes from the tests: imports of ``tests`` / ``fixtures`` and ``sys.path``
    entries naming the tests folder."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] in ("tests", "fixtures")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("tests", "fixtures"):
            found.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ("tests", "fixtures"):
            found.append(f"the path {node.value!r}")  # sys.path.insert(0, ROOT / "tests")
    return found


def test_no_benchmark_imports_the_tests(tmp_path):
    """The benchmarks run from a checkout without the tests: the tiny models both use live in the package."""
    offenders = {
        path.name: found
        for path in sorted((SOURCE_ROOT / "benchmarks").rglob("*.py"))
        if (found := benchmark_test_imports(path))
    }
    assert not offenders, offenders
    bad = tmp_path / "bench_bad.py"
    bad.write_text('import sys\nsys.path.insert(0, str(ROOT / "tests"))\nfrom fixtures.families import CASES\n')
    assert set(benchmark_test_imports(bad)) == {"the path 'tests'", "fixtures.families"}  # the check sees both
