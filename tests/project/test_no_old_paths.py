"""Nothing has been released, so nothing is deprecated: no old import path resolves, no shim warns."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# paths that resolved (with a DeprecationWarning) before the house's third floor
OLD_PATHS = [
    "mmpos.pipelines.camera_clips",
    "mmpos.pipelines.lens_augment",
    "mmpos.pipelines.tiny_wan",
    "mmpos.pipelines.cli",
    "mmpos.pipelines.video_cli",
    "mmpos.pipelines.world_video_cli",
    "mmpos.pipelines.edit_methods",
    "mmpos.world.trainer",
    "mmpos.world.models",
    "mmpos.world.edit_runs",
    "mmpos.integrations.diffusers.models",
    "mmpos.integrations.diffusers.video_cameras",
    "mmpos._deprecation",
]


@pytest.mark.parametrize("path", OLD_PATHS)
def test_an_old_path_does_not_import(path):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(path)


def test_no_source_file_raises_a_deprecation_warning():
    """No ``DeprecationWarning`` / ``FutureWarning`` is issued by the package (warnings of the peers mmpos calls are
    theirs)."""
    found = []
    for root in ("mmpos", "pipelines"):
        for file in (ROOT / root).rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Name) and node.id in ("DeprecationWarning", "FutureWarning"):
                    found.append(f"{file.relative_to(ROOT)}:{node.lineno}")
    assert found == []
