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

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.relative_to(ROOT / "configs").as_posix() for p in (ROOT / "configs").rglob("*.yaml"))
WORLD_MODEL_FILES = ["world-vae/config.json", "world-vae/diffusion_pytorch_model.safetensors"] + [
    f"world-{task}/{part}/{name}"
    for task in ("t2i", "fill", "kontext")
    for part in ("transformer", "text_encoder")
    for name in ("config.json", "diffusion_pytorch_model.safetensors")
]

# run in the installed copy: each line prints what the code resolved
PROBE = """
from mmpos.pipelines.commands._config import default_config_path
from mmpos.models.world.image import DEFAULT_ASSETS, check_world_checkpoint
import mmpos
print(mmpos.__file__)
print(default_config_path("edit_band"), default_config_path("edit_band").is_file())
print(check_world_checkpoint(DEFAULT_ASSETS))
"""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("MMPOS_SLOW") != "1", reason="slow: builds a wheel (MMPOS_SLOW=1)"),
]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a clean copy of the source (a stale ``build/`` in the checkout would ship old files)."""
    source, dist = tmp_path_factory.mktemp("source") / "mmpos", tmp_path_factory.mktemp("dist")
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "outputs", "runs", "data", ".pytest_cache"
        ),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)], check=True, timeout=900
    )
    return next(dist.glob("mmpos_toolbox-*.whl"))


def test_the_wheel_holds_the_configs_and_world_models(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f"mmpos/configs/{c}" for c in CONFIGS if f"mmpos/configs/{c}" not in names]
    missing += [f"mmpos/assets/{f}" for f in WORLD_MODEL_FILES if f"mmpos/assets/{f}" not in names]
    assert not missing
    assert not any(n.startswith(("configs/", "assets/", "pipelines/")) for n in names)  # nothing at the top level


def test_the_wheel_holds_the_licence_and_the_type_marker(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "mmpos/py.typed" in names
    licences = [n for n in names if ".dist-info/" in n and n.rsplit("/", 1)[-1] in ("LICENSE", "NOTICE")]
    assert {n.rsplit("/", 1)[-1] for n in licences} == {"LICENSE", "NOTICE"}, sorted(
        n for n in names if "dist-info" in n
    )
    text = zipfile.ZipFile(wheel).read(next(n for n in licences if n.endswith("LICENSE"))).decode()
    assert text == (ROOT / "LICENSE").read_text()


def test_installed_code_finds_its_data(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        timeout=600,
    )
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert result.returncode == 0, result.stderr
    package, config, assets = result.stdout.strip().splitlines()[-3:]
    installed = site / "mmpos"
    assert Path(package).parent == installed  # the installed copy, not the checkout
    assert config == f"{installed / 'configs' / 'edit_band.yaml'} True"
    assert assets == str(installed / "assets")


# The default commands on a base install (no extras): each one's smallest run. ``{data}`` is a small positional
# folder made in the fresh venv, ``{img}`` a user's 64 x 64 background and 48 x 40 object.
STEPS1 = ["--set", "sampler.num_inference_steps=1", "--set", "figure.sweep=[0.0]"]
BASE_COMMANDS = [
    ["demo", "--steps", "1", "--count", "1", "--out", "demo"],
    ["list"],
    ["world", "sample", "--caption", "a red star", "--steps", "1", "--out", "sample"],
    [
        "edit",
        "transplant",
        "--model",
        "world",
        "--background",
        "{img}/bg.png",
        "--reference",
        "{img}/obj.png",
        "--box",
        "8",
        "8",
        "40",
        "40",
        "--out",
        "transplant",
        *STEPS1,
    ],
    ["edit", "band", "--model", "world", "--target", "a large blue square at center", "--out", "band", *STEPS1],
    [
        "generate",
        "--model",
        "world",
        "--prompt",
        "a red star",
        "--out",
        "generate",
        "--set",
        "sampler.num_inference_steps=1",
    ],
    [
        "generate",
        "video",
        "--model",
        "tiny",
        "--frames",
        "5",
        "--height",
        "32",
        "--width",
        "32",
        "--steps",
        "1",
        "--camera",
        "preset:pan",
        "--out",
        "video",
    ],
    ["viz", "cameras", "preset:pan", "--frames", "3", "--out", "cameras"],
    [
        "train",
        "vit",
        "--data-dir",
        "{data}",
        "--output-dir",
        "vit",
        "--set",
        "steps=1",
        "--set",
        "img_size=32",
        "--set",
        "batch_size=4",
        "--set",
        "eval_sizes=[32]",
        "--set",
        "model=vit_tiny_patch16_224",
        "--set",
        "model_kwargs={patch_size: 8, embed_dim: 32, depth: 1, num_heads: 2}",
        "--set",
        "num_workers=0",
    ],
]
MAKE_INPUTS = """
import sys, numpy as np
from PIL import Image
from mmpos.world.positional import write_positional_folder
root = sys.argv[1]
for split, count, seed in (("train", 8, 0), ("val", 4, 1)):
    write_positional_folder(f"{root}/data/{split}", count, seed=seed, task="relation", image_size=32)
Image.fromarray(np.full((64, 64, 3), (250, 250, 200), np.uint8)).save(f"{root}/bg.png")
Image.fromarray(np.full((40, 48, 3), (220, 30, 30), np.uint8)).save(f"{root}/obj.png")
"""
TORCH_PINS = ["torch==2.14.1", "torchvision==0.29.1"]  # as in the Makefile


def test_a_base_install_runs_every_default_command(wheel, tmp_path):
    """A fresh venv with the wheel and its declared dependencies only (no test extras): every default command's
    smallest run exits 0 (a missing dependency fails here, not on a user's machine)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, *TORCH_PINS], check=True, timeout=1800)
    subprocess.run([*pip, str(wheel)], check=True, timeout=1800)
    python, mmpos_cli = str(venv / "bin" / "python"), str(venv / "bin" / "mmpos")
    extras = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('pytest'), u.find_spec('hypothesis'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert extras.stdout.split() == ["None", "None"]  # the test extras are not there
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run([python, "-c", MAKE_INPUTS, str(work)], check=True, timeout=300, cwd=work)
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": ""}
    failures = []
    for command in BASE_COMMANDS:
        argv = [a.replace("{img}", str(work)).replace("{data}", str(work / "data")) for a in command]
        result = subprocess.run([mmpos_cli, *argv], cwd=work, capture_output=True, text=True, timeout=1200, env=env)
        if result.returncode != 0:
            failures.append(f"mmpos {' '.join(argv)} -> {result.returncode}: {result.stderr[-2000:]}")
    assert not failures, "\n\n".join(failures)
