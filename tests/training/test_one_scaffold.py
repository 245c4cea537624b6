"""One training scaffold: the package calls a backward pass in exactly one place (the scaffold's ``backward``, with
its NaN stop), every trainer goes through it, and every task is registered once."""

import ast
import importlib
import re
from pathlib import Path

import pytest

import mmpos
from mmpos.training.tasks import TASKS, task_module

ROOT = Path(mmpos.__file__).resolve().parent.parent
BACKWARD = re.compile(r"\.backward\(")


def backward_sites(folders=(ROOT / "mmpos", ROOT / "pipelines")) -> list[str]:
    """``path:line`` of every ``.backward(`` call in the code under ``folders`` (comments and docstrings left out)."""
    sites = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and BACKWARD.search(ast.unparse(node.func) + "("):
                    sites.append(f"{path.relative_to(folder.parent)}:{node.lineno}")
    return sites


def test_the_package_calls_backward_in_one_place():
    sites = backward_sites()
    assert len(sites) == 1 and sites[0].startswith("mmpos/training/scaffold/loop.py:"), sites


def test_the_search_finds_calls_and_skips_text(tmp_path):  # the checker's negative control
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "steps.py").write_text(
        '"""Calls ``loss.backward()`` once."""\n\n\ndef step(loss, scaler):\n    loss.backward()  # .backward(\n'
        "    scaler.scale(loss).backward(retain_graph=True)\n"
    )
    assert backward_sites([tmp_path / "pkg"]) == ["pkg/steps.py:5", "pkg/steps.py:6"]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_trainer_takes_the_scaffolds_backward_pass(name):
    source = Path(task_module(name).__file__).read_text(encoding="utf-8")
    assert re.search(r"\b(backward|update_averaging_gradients|TrainingTask)\b", source), name
    assert not BACKWARD.search(source), name


def test_the_registry_names_every_task_module_once():
    modules = {path.stem for path in (ROOT / "mmpos" / "training" / "tasks").glob("*.py")} - {"__init__"}
    assert sorted(entry.module for entry in TASKS.values()) == sorted(modules)
    assert all((ROOT / entry.script).is_file() for entry in TASKS.values())
    with pytest.raises(KeyError, match="unknown training task 'gan'; registered: vit, dit"):
        task_module("gan")


def test_one_definition_of_each_scaffold_piece():
    """``latest_checkpoint``, ``load_checkpoint`` / ``save_checkpoint`` and ``make_accelerator`` are defined once."""
    names = ("latest_checkpoint", "load_checkpoint", "save_checkpoint", "make_accelerator")
    found = {name: [] for name in names}
    for path in sorted((ROOT / "mmpos").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name in found:
                found[node.name].append(str(path.relative_to(ROOT)))
    assert {name: len(places) for name, places in found.items()} == dict.fromkeys(names, 1), found
    assert importlib.import_module("mmpos.training.scaffold.processes").make_accelerator
