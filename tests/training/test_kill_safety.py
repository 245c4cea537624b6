"""A training run killed while it writes keeps a resumable state: the world trainer's checkpoint
(``train-<task>/checkpoint-<step>/``, the training scaffold's) is written to a temporary folder and renamed into
place, so a kill (SIGKILL from a watcher, or a writer failing mid-write) leaves the previous complete checkpoint,
never a truncated part or parts of two steps; a NaN loss stops the run before it reaches the weights."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmpos._atomic import folder_written_atomically, recover_folder, replace_folder
from mmpos._validation import NonFiniteLossError
from mmpos.training.task_configs import WorldImageConfig
from mmpos.training.tasks.world_image import WorldTrainer, train

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_VAE = dict(block_out_channels=(8, 16), norm_num_groups=4)
CONFIG = dict(
    task="vae",
    vae=TINY_VAE,
    image_size=32,
    num_examples=16,
    batch_size=4,
    device="cpu",
    num_samples=1,
    log_every=1,
    warmup_steps=1,
    max_minutes=5.0,
    lr=1e-3,
)

# a child that saves its state over and over until it is killed; at step n every part holds n: the progress, the
# first weight of the model (accelerate's model.safetensors) and the EMA's update count (ema.pt)
SAVER = """
import sys, torch
torch.set_num_threads(1)
from mmpos.training.task_configs import WorldImageConfig
from mmpos.training.tasks.world_image import WorldTrainer
trainer = WorldTrainer(WorldImageConfig(**{config}), sys.argv[1], progress=False)
print("ready", flush=True)
while True:
    trainer.step += 1
    trainer.history.append([trainer.step, 0.0])
    with torch.no_grad():
        next(trainer.raw.parameters()).fill_(trainer.step)
    trainer.ema.num_updates.fill_(trainer.step)
    trainer.save_state()
"""


def saved_step(state_dir: Path) -> int:
    return json.loads((state_dir / "progress.json").read_text())["step"]


def complete(run_dir: Path) -> dict:
    return {
        p.relative_to(run_dir).as_posix(): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and not p.relative_to(run_dir).parts[0].startswith(".")
    }


def resumed(out_dir) -> WorldTrainer:
    trainer = WorldTrainer(WorldImageConfig(**CONFIG), out_dir, progress=False)
    trainer.load_state()
    return trainer


def test_sigkill_while_the_state_is_written_leaves_a_resumable_state(tmp_path):
    out, log = tmp_path / "run", tmp_path / "child.log"
    with open(log, "w") as errors:
        child = subprocess.Popen(
            [sys.executable, "-c", SAVER.format(config=repr(CONFIG)), str(out)],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    run_dir = out / "train-vae"

    def later_save_under_way():
        return any((p / "model.safetensors").exists() for p in run_dir.glob(".checkpoint-*.partial")) and any(
            run_dir.glob("checkpoint-*")
        )

    try:
        assert child.stdout.readline().strip() == "ready", log.read_text()
        deadline = time.time() + 60
        while not later_save_under_way():
            assert time.time() < deadline and child.poll() is None, log.read_text()
            time.sleep(0.001)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    trainer = resumed(out)  # a truncated part or weights of one step with progress of another: never
    step = trainer.step
    assert step >= 1 and trainer.history == [[s, 0.0] for s in range(1, step + 1)]
    assert bool((next(trainer.raw.parameters()) == step).all())  # the weights of the same step
    assert trainer.ema.num_updates.item() == step  # and its EMA


def test_a_writer_failing_mid_write_keeps_the_previous_state(tmp_path, monkeypatch):
    import mmpos.training.tasks.world_image as trainer_module

    train(WorldImageConfig(**{**CONFIG, "max_steps": 2, "sample_steps": 1}), tmp_path, progress=False)
    run_dir = tmp_path / "train-vae"
    before = complete(run_dir)
    trainer = resumed(tmp_path)
    trainer.step += 1
    with torch.no_grad():
        next(trainer.raw.parameters()).fill_(3.0)  # step 3's weights: written before the failing part

    def failing_save(*args, **kwargs):  # the disk fills up (or the process dies) while a part is written
        raise OSError("No space left on device")

    monkeypatch.setattr(trainer_module, "write_json", failing_save)
    with pytest.raises(OSError, match="No space left"):
        trainer.save_state()
    monkeypatch.undo()
    assert complete(run_dir) == before  # the complete checkpoints untouched; the partial one is not a checkpoint
    assert [p.name for p in run_dir.glob("checkpoint-*")] == ["checkpoint-2"]
    assert resumed(tmp_path).step == 2


def test_a_truncated_part_is_named(tmp_path):
    train(WorldImageConfig(**{**CONFIG, "max_steps": 1, "sample_steps": 1}), tmp_path, progress=False)
    (tmp_path / "train-vae" / "checkpoint-1" / "ema.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"ema\.safetensors: 0 bytes, recorded \d+"):
        resumed(tmp_path)


def test_a_nan_loss_stops_before_the_update_and_keeps_the_last_state(tmp_path):
    train(WorldImageConfig(**{**CONFIG, "max_steps": 2, "sample_steps": 1}), tmp_path, progress=False)
    run_dir = tmp_path / "train-vae"
    before = complete(run_dir)
    trainer = resumed(tmp_path)
    trainer.config.max_steps = 4
    weights = [p.detach().clone() for p in trainer.raw.parameters()]
    trainer.loss = lambda index, generator: torch.tensor(float("nan"), requires_grad=True)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 3.*train-vae/checkpoint-2, is kept"):
        trainer.run({"stop": False})
    assert all(torch.equal(a, b) for a, b in zip(weights, trainer.raw.parameters()))
    assert complete(run_dir) == before


def test_a_kill_between_the_two_renames_is_recovered(tmp_path, monkeypatch):
    folder = tmp_path / "state"
    with folder_written_atomically(folder) as partial:
        (partial / "part").write_text("old")
    with folder_written_atomically(tmp_path / "next") as partial:
        (partial / "part").write_text("new")
    calls = []
    real_replace = os.replace

    def dies_before_the_second(source, target):
        calls.append(target)
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed after the old folder moved aside, before the new one moved in
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", dies_before_the_second)
    with pytest.raises(KeyboardInterrupt):
        replace_folder(tmp_path / "next", folder)
    monkeypatch.undo()
    assert not folder.exists()
    assert (recover_folder(folder) / "part").read_text() == "old"
