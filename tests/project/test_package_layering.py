"""The core never imports the application layer (``mmpos.pipelines``), and both come from one installation."""

import ast
import sys
from pathlib import Path

import pytest

import mmpos

CORE = ("coords", "spectrum", "ops", "encodings", "camera", "integrations", "models")
PACKAGE_ROOT = Path(mmpos.__file__).resolve().parent


def absolute_imports(source: str, package: str) -> list[str]:
    """Every module name ``source`` imports (and ``module.name`` for ``from module import name``), relative
    imports resolved against ``package`` (the package the source sits in)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[: len(parts) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def is_application_layer(name: str) -> bool:
    return name in ("pipelines", "mmpos.pipelines") or name.startswith(("pipelines.", "mmpos.pipelines."))


def test_absolute_imports_resolves_relative_imports():
    source = "from ..pipelines import band\nfrom . import x\nimport mmpos.pipelines.loose\n"
    names = absolute_imports(source, "mmpos.integrations")
    assert "mmpos.pipelines" in names and "mmpos.integrations.x" in names and "mmpos.pipelines.loose" in names
    assert [n for n in names if is_application_layer(n)] == [
        "mmpos.pipelines",
        "mmpos.pipelines.band",
        "mmpos.pipelines.loose",
    ]


@pytest.mark.parametrize("part", CORE)
def test_core_never_imports_the_pipelines(part):
    offenders = []
    for path in sorted((PACKAGE_ROOT / part).rglob("*.py")):
        relative = path.relative_to(PACKAGE_ROOT.parent)
        package = ".".join(relative.parts[:-1])  # a module's package; an __init__'s own package
        imported = absolute_imports(path.read_text(), package)
        offenders += [f"{relative}: {name}" for name in imported if is_application_layer(name)]
    assert not offenders, "the core imports the application layer:\n" + "\n".join(offenders)


def test_pipelines_come_from_the_same_installation_as_mmpos():
    import mmpos.pipelines
    import mmpos.pipelines.edits.band  # noqa: F401

    pipelines_init = Path(mmpos.pipelines.__file__).resolve()
    # setup.py maps mmpos.pipelines to the top-level pipelines/ folder: beside mmpos/ in a checkout (editable),
    # inside mmpos/ in a built wheel
    assert pipelines_init in (
        PACKAGE_ROOT.parent / "pipelines" / "__init__.py",
        PACKAGE_ROOT / "pipelines" / "__init__.py",
    )
    assert not [name for name in sys.modules if name == "pipelines" or name.startswith("pipelines.")], (
        "pipelines/ was also imported as a bare top-level package (two copies of every class)"
    )
