"""A non-editable install (a wheel) ships the data the commands read at run time, and the code finds it there:
the default configs of ``mmpos edit`` / ``generate`` and the world models of ``mmpos demo`` / ``world sample``.

Slow (builds a 14 MB wheel, then imports it from a plain folder): run with ``MMPOS_SLOW=1``.
"""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.relative_to(ROOT / "configs").as_posix() for p in (ROOT / "configs").rglob("*.yaml"))
WORLD_MODEL_FILES = ["world-vae/config.json", "world-vae/diffusion_pytorch_model.safetensors"] + [
    f"world-{task}/{part}/{name}" for task in ("t2i", "fill", "kontext") for part in ("transformer", "text_encoder")
    for name in ("config.json", "diffusion_pytorch_model.safetensors")]

# run in the installed copy: each line prints what the code resolved
PROBE = """
from mmpos.pipelines.config import default_config_path
from mmpos.world.models import DEFAULT_ASSETS, check_world_checkpoint
import mmpos
print(mmpos.__file__)
print(default_config_path("edit_band"), default_config_path("edit_band").is_file())
print(check_world_checkpoint(DEFAULT_ASSETS))
"""

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("MMPOS_SLOW") != "1", reason="slow: builds a wheel (MMPOS_SLOW=1)")]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a clean copy of the source (a stale ``build/`` in the checkout would ship old files)."""
    source, dist = tmp_path_factory.mktemp("source") / "mmpos", tmp_path_factory.mktemp("dist")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "outputs", "runs", "data", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
                   check=True, timeout=900)
    return next(dist.glob("mmpos-*.whl"))


def test_the_wheel_holds_the_configs_and_world_models(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f"mmpos/configs/{c}" for c in CONFIGS if f"mmpos/configs/{c}" not in names]
    missing += [f"mmpos/assets/{f}" for f in WORLD_MODEL_FILES if f"mmpos/assets/{f}" not in names]
    assert not missing
    assert not any(n.startswith(("configs/", "assets/", "pipelines/")) for n in names)  # nothing at the top level


def test_installed_code_finds_its_data(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, timeout=600)
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stderr
    package, config, assets = result.stdout.strip().splitlines()[-3:]
    installed = site / "mmpos"
    assert Path(package).parent == installed  # the installed copy, not the checkout
    assert config == f"{installed / 'configs' / 'edit_band.yaml'} True"
    assert assets == str(installed / "assets")
