"""Every code block of README.md, CONTRIBUTING.md and docs/*.md runs as written (markers: ``tests/fixtures/doc_blocks.py``,
docs/README.md).

Python blocks of a page run in order in one namespace, in a temporary working folder; ``needs-weights`` blocks run
on tiny offline components (``tests/fixtures/doc_tiny_weights.py``). Shell blocks run line by line with ``bash`` on the
CPU, in a temporary folder that links the repository's scripts, configs, assets and benchmarks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.doc_blocks import (
    MARKER_KINDS,
    PAGES,
    ROOT,
    SHELL_LANGUAGES,
    all_blocks,
    page_blocks,
    shell_commands,
)
from tests.fixtures.doc_tiny_weights import tiny_offline_weights
from tests.fixtures.photos import save_photo

pytestmark = pytest.mark.usefixtures("one_thread")

BLOCKS = all_blocks()
PYTHON_PAGES = [page for page in PAGES if any(b.language == "python" for b in page_blocks(page))]
SHELL_BLOCKS = [b for b in BLOCKS if b.language in SHELL_LANGUAGES]
LINKED = ("scripts", "configs", "assets", "benchmarks", "mmpos", "pipelines", "Makefile", "pyproject.toml", "setup.py")
USER_IMAGES = (
    "background.png",
    "where.png",
    "object.png",
    "object_mask.png",
    "collage.png",
    "original.png",
    "my.png",
    "obj.png",
)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """A working folder with the repository's data folders linked and small images under the names pages open."""
    from PIL import Image

    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    rng = np.random.default_rng(0)
    for name in USER_IMAGES:
        pixels = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
        if "mask" in name or name == "where.png":
            pixels = np.zeros((64, 64, 3), np.uint8)
            pixels[16:48, 16:48] = 255
        Image.fromarray(pixels).save(tmp_path / name)
    save_photo(tmp_path / "photo.jpg")  # a 600 x 400 photo-like image: the README's photo edit
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def tiny_family_models(tmp_path_factory):
    """Tiny saved FLUX.2 Klein, Qwen-Image(-Edit) and Z-Image pipelines and prompt embeddings (built once)."""
    from tests.fixtures.tiny_edit_families import save_tiny_family_models

    root = tmp_path_factory.mktemp("tiny_family_models")
    save_tiny_family_models(root)
    return root


def test_every_block_has_a_language_and_a_known_marker():
    for block in BLOCKS:
        assert block.language, f"{block.where}: a fenced block needs a language (python, bash, text, ...)"
        assert block.marker in MARKER_KINDS | {""}, f"{block.where}: unknown doc-test marker {block.marker!r}"
        if block.marker == "skip":
            assert block.reason, f"{block.where}: a skip marker needs its reason"
        block.runnable_code  # every small: replacement occurs in its block


def run_python_blocks(page: Path, namespace: dict) -> int:
    """Run the page's Python blocks in order in ``namespace``; returns how many ran."""
    ran = 0
    for block in page_blocks(page):
        if block.language != "python" or block.marker == "skip":
            continue
        code = compile(block.runnable_code, block.where, "exec")
        with tiny_offline_weights() if block.marker == "needs-weights" else contextlib.nullcontext():
            exec(code, namespace)
        ran += 1
    return ran


@pytest.fixture
def page_namespace():
    """A page's namespace; encodings and edit methods the page registers (docs/adding_an_encoding.md,
    docs/adding_an_edit.md) leave their registries after."""
    from mmpos.encodings import registry
    from mmpos.pipelines import edits

    namespace = {"__name__": "doc_page"}
    encodings_before, edits_before = set(registry._REGISTRY), set(edits.list_edits())
    yield namespace
    for name in set(registry._REGISTRY) - encodings_before:  # a page importing a registered class keeps it
        registry._REGISTRY.pop(name)
    for name in set(edits.list_edits()) - edits_before:
        edits.unregister_edit(name)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_no_indented_code_blocks(page):
    """Code is fenced with its language, so that this module finds and runs it (no 4-space indented blocks)."""
    lines, fenced = page.read_text().splitlines(), False
    for number, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("    ") and number and not lines[number - 1].strip():
            pytest.fail(f"{_name(page)}:{number + 1}: an indented code block; fence it with its language")


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_name)
def test_python_blocks_run(page, user_folder, page_namespace):
    assert run_python_blocks(page, page_namespace) > 0


def test_the_worked_example_of_adding_an_encoding_passes_the_registry_sweep(user_folder, page_namespace, capsys):
    from mmpos.encodings import registry
    from tests.encodings import test_registry_sweep as sweep

    run_python_blocks(ROOT / "docs" / "adding_an_encoding.md", page_namespace)
    assert "torch.Size([1, 3])" in capsys.readouterr().out
    assert "rope_golden" in registry.list_pes()
    checks = [
        sweep.test_kind_capabilities_and_example_options_agree,
        sweep.test_relative_property_matches_the_claim,
        sweep.test_inputs_are_not_modified,
        sweep.test_gradcheck,
        sweep.test_option_validation_names_the_option,
        sweep.test_forward_inside_a_timm_vit,
        sweep.test_forward_inside_a_tiny_flux,
    ]
    for check in checks:  # every check applies to a relative 2D rotary encoding: none may skip
        try:
            check("rope_golden")
        except pytest.skip.Exception as skipped:
            pytest.fail(f"{check.__name__} skipped rope_golden: {skipped}")


def test_the_worked_camera_encoding_passes_the_registry_sweep(user_folder, page_namespace, capsys):
    """The page's camera encoding (one module, one registration) runs in the consumers and passes every check of
    the sweep that applies to a camera encoding."""
    from mmpos.encodings import registry
    from tests.encodings import test_registry_sweep as sweep

    run_python_blocks(ROOT / "docs" / "adding_an_encoding.md", page_namespace)
    printed = capsys.readouterr().out
    assert "torch.Size([1, 3, 8, 8])" in printed and "torch.Size([3, 4])" in printed
    assert "camera_rotation" in registry.list_pes("camera")
    checks = [
        sweep.test_kind_capabilities_and_example_options_agree,
        sweep.test_inputs_are_not_modified,
        sweep.test_gradcheck,
        sweep.test_option_validation_names_the_option,
        sweep.test_world_frame_invariance_matches_the_claim,
    ]
    for check in checks:
        try:
            check("camera_rotation")
        except pytest.skip.Exception as skipped:
            pytest.fail(f"{check.__name__} skipped camera_rotation: {skipped}")


def _shell_environment() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", MPLBACKEND="Agg", CUDA_VISIBLE_DEVICES="")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(b, marks=[pytest.mark.slow] if b.marker == "slow" else [])
        for b in SHELL_BLOCKS
        if b.marker in ("", "run", "slow")
    ],
    ids=lambda b: b.where,
)
def test_shell_lines_run(block, user_folder, request):
    commands = shell_commands(block)
    assert commands
    if "tiny/" in block.runnable_code:  # the block's small: text runs it on the tiny saved family pipelines
        (user_folder / "tiny").symlink_to(request.getfixturevalue("tiny_family_models"))
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", "set -e; " + command],
            cwd=user_folder,
            env=_shell_environment(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{block.where}: {command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("block", [b for b in SHELL_BLOCKS if b.marker == "setup"], ids=lambda b: b.where)
def test_setup_commands_name_makefile_targets(block):
    """``make test`` itself is what CI runs (``.ci/run``); here: each set-up line is a target the Makefile has."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for command in shell_commands(block):
        words = command.split("#")[0].split()
        assert words[0] == "make", f"{block.where}: a setup line is a make target, got {command!r}"
        done = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, f"{block.where}: make -n {' '.join(words[1:])}: {done.stderr}"


def test_results_world_losses_are_the_model_cards():
    """The results page's "start -> end" validation losses of the shipped world models are their cards' values."""
    import json
    import re

    text = (ROOT / "docs" / "results.md").read_text()
    for task in ("t2i", "fill", "kontext"):
        card = json.loads((ROOT / "assets" / f"world-{task}" / "model_card.json").read_text())
        row = next(line for line in text.splitlines() if line.startswith(f"| {task} | {card['total_steps']} |"))
        start, end = re.search(r"(\d\.\d+) -> (\d\.\d+)", row).groups()
        assert (float(start), float(end)) == (round(card["val_loss_start"], 3), round(card["val_loss"], 3)), row
        if task != "fill":  # same validation data as the run it continued: it starts where that one ended
            assert card["val_loss_start"] == card["init_from"]["val_loss"]
