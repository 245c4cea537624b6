"""Ctrl-C during training (issue 31, item 3): a run sent SIGINT mid-update writes a checkpoint at the update
boundary, prints one line with the resume command and exits 130 without a traceback; running that command
finishes the run with the losses and weights of an uninterrupted one. Both trainers: the scaffold (DiT) and the
ViT loop (one helper, :mod:`mmpos.training.scaffold.interrupt`)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from mmpos.training.scaffold.folders import checkpoints
from mmpos.training.scaffold.interrupt import resume_command
from tests.training.test_training_scaffold import TINY_DIT

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parents[1] / "workers" / "sigint_worker.py"


def run(argv, signal_at=0, **env):
    env = {**os.environ, "MMPOS_TEST_SIGINT_AT": str(signal_at), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, start_new_session=True)


def interrupt_and_resume(trainer, args, out, signal_at):
    """Run with SIGINT at loss call ``signal_at``, check the stop, then run the printed resume command."""
    stopped = run([sys.executable, str(WORKER), trainer, *args], signal_at)
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr + stopped.stdout
    lines = [line for line in stopped.stdout.splitlines() if "resume with:" in line]
    assert len(lines) == 1, stopped.stdout
    assert lines[0].startswith("interrupted (SIGINT): saved ")
    command = shlex.split(lines[0].split("resume with: ", 1)[1])
    assert command[-1] == "--resume" and command[1] == str(WORKER)
    assert [c.name for c in checkpoints(out)][-1] == f"checkpoint-{signal_at}"  # the update in flight finished
    resumed = run(command)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {out}/checkpoint-{signal_at}" in resumed.stdout + resumed.stderr


DIT = [*TINY_DIT, "--batch-size", "4", "--steps", "8", "--checkpoint-every", "100"]


def test_scaffold_run_interrupted_and_resumed_equals_an_uninterrupted_one(tmp_path):
    common = DIT
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert run([sys.executable, str(WORKER), "dit", *common, "--out", str(whole)]).returncode == 0
    interrupt_and_resume("dit", [*common, "--out", str(cut)], cut, signal_at=3)  # mid-epoch (6 batches/epoch)
    assert (cut / "log.jsonl").read_text() == (whole / "log.jsonl").read_text()
    for name in ("model", "model_ema"):
        files = sorted(p.relative_to(whole) for p in (whole / name).rglob("*") if p.is_file())
        assert files and all((cut / f).read_bytes() == (whole / f).read_bytes() for f in files)


def test_a_signal_on_one_of_two_processes_stops_both_at_the_same_update(tmp_path):
    """torchrun, gloo: only rank 1 is signalled; the request is reduced over the processes, so both write their
    part of one checkpoint at update 3, rank 0 prints the one line, both exit 130."""
    out = tmp_path / "two"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29547",
        str(WORKER),
        "dit",
        *DIT,
        "--batch-size",
        "2",
        "--out",
        str(out),
    ]
    done = run(command, signal_at=3, MMPOS_TEST_SIGINT_RANK="1")
    assert done.returncode != 0 and "exitcode  : 130" in done.stderr + done.stdout, done.stderr[-3000:]
    assert (
        done.stdout.count("resume with:") == 1
        and f"interrupted (a signal on another process): saved {out}/checkpoint-3" in done.stdout
    ), done.stdout
    assert [c.name for c in checkpoints(out)] == ["checkpoint-3"]
    assert {"rng_0.json", "rng_1.json"} <= {p.name for p in (out / "checkpoint-3").iterdir()}


@pytest.fixture(scope="module")
def vit_config(tmp_path_factory):
    from mmpos.world.positional import write_positional_folder
    from tests.training.test_train_vit import tiny_config

    root = tmp_path_factory.mktemp("relation")
    write_positional_folder(root / "train", 32, seed=0, task="relation", image_size=32)
    write_positional_folder(root / "val", 12, seed=1, task="relation", image_size=32)
    path = root / "tiny.yaml"
    config = tiny_config(root, steps=6, checkpoint_every=100, eval_sizes=[32], eval_extrapolation=["none"])
    path.write_text(yaml.safe_dump(asdict(config)))
    return path


def test_vit_run_interrupted_and_resumed_equals_an_uninterrupted_one(vit_config, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert (
        run([sys.executable, str(WORKER), "vit", "--config", str(vit_config), "--output-dir", str(whole)]).returncode
        == 0
    )
    # with DataLoader workers, which the terminal's Ctrl-C reaches too (the uninterrupted run has none)
    interrupt_and_resume(
        "vit", ["--config", str(vit_config), "--output-dir", str(cut), "--set", "num_workers=2"], cut, signal_at=3
    )
    assert (cut / "log.csv").read_text().count("\n") == (whole / "log.csv").read_text().count("\n") == 7
    strip = lambda run: [line.split(",")[:4] for line in (run / "log.csv").read_text().splitlines()]  # noqa: E731
    assert strip(cut) == strip(whole)  # step, epoch, loss, lr of all 6 updates
    assert (cut / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()
    assert (
        json.loads((cut / "results.json").read_text())["eval"]
        == json.loads((whole / "results.json").read_text())["eval"]
    )


def test_resume_command_drops_overwrite_and_an_explicit_checkpoint():
    assert (
        resume_command(["/venv/bin/mmpos", "train", "vit", "--overwrite", "--output-dir", "run dir"])
        == "mmpos train vit --output-dir 'run dir' --resume"
    )
    command = resume_command(["scripts/train_dit.py", "--resume", "out/checkpoint-4", "--out", "out"])
    assert command.endswith("scripts/train_dit.py --out out --resume")


def test_shipped_vit_configs_checkpoint_within_a_tenth_of_their_run():
    for path in sorted((ROOT / "configs" / "vit").glob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        assert config["checkpoint_every"] <= config["steps"] / 10, path.name
