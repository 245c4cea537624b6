"""Training the world's models: the VAE (reconstruction + KL) and Flux transformers (rectified flow).

:func:`train` runs one task (:class:`~mmpos.training.world.trainer.WorldTrainer`) until its step or time budget or SIGTERM.
The pieces: :mod:`.latents` (packing, ids), :mod:`.training_data`, :mod:`.losses`, :mod:`.checkpoints`
(loading trained models), :mod:`.trainer` (the loop, EMA, resume), :mod:`.export` (writing the model).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

from .trainer import ALL_TASKS, DEFAULTS, WorldTrainer

__all__ = [
    "ALL_TASKS",
    "DEFAULTS",
    "WorldTrainer",
    "check_earlier_run",
    "check_writable_folder",
    "stop_on_sigterm",
    "train",
]


@contextmanager
def stop_on_sigterm():
    """Yields a dict whose ``"stop"`` turns True on SIGTERM (so ``timeout`` ends training, not the export)."""
    flag = {"stop": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: flag.update(stop=True))
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)


def train(config: dict, out_dir, resume: bool = False, progress: bool = True, overwrite: bool = False) -> dict:
    """Train ``config['task']``; write the model (EMA weights), model card and samples under ``out_dir``.

    Runs on N processes (torchrun / ``accelerate launch``): ``batch_size`` is per process; every process draws the
    global batch and trains on its slice, only the main process writes (checkpoints ``out_dir/train-<task>/
    checkpoint-<step>/``, the export). ``resume`` continues the newest checkpoint (or an earlier layout's
    ``train_state-<task>/``); ``overwrite`` deletes the earlier run's checkpoints first.

    Stops at ``max_steps``, after ``max_minutes`` of training or on SIGTERM; a NaN or inf loss raises
    :class:`~mmpos._validation.NonFiniteLossError`, keeping the last checkpoint. An ``out_dir`` that is a file or
    cannot be written is refused before training. Returns the model card, whose
    ``val_loss_start`` is the validation loss of the starting weights (random, or ``init_from``'s on this run's
    validation data: then equal to the previous card's ``val_loss`` when the data are the same), measured before the
    first step and kept by ``resume``; ``val_loss`` is the final EMA weights'. Validation uses fixed examples, sigmas
    and noise (:func:`~mmpos.training.world.losses.validation_loss`), so values of different runs compare.
    """
    check_writable_folder(out_dir)
    trainer = WorldTrainer(config, out_dir, progress)
    if overwrite and not resume:  # the earlier run's checkpoints go; its export is replaced once the new one is whole
        trainer.accelerator.wait_for_everyone()
        if trainer.accelerator.is_main_process:
            for folder in (trainer.run_dir, trainer.state_dir):
                shutil.rmtree(folder, ignore_errors=True)
        trainer.accelerator.wait_for_everyone()
    if resume:
        trainer.load_state()
    with stop_on_sigterm() as signals:
        trainer.run(signals)
    trainer.save_state()
    return trainer.finish()


def check_writable_folder(out_dir) -> Path:
    """``out_dir``, made if missing; a file or a folder that cannot be written raises, naming it."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file; expected a folder")
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK | os.X_OK):
        raise PermissionError(f"--out {out} is not writable")
    return out


def check_earlier_run(out_dir, task: str, resume: bool, overwrite: bool) -> None:
    """A fresh run over an earlier run of ``task`` in ``out_dir`` (its train state or export) is refused unless
    ``resume`` (continue it) or ``overwrite`` (replace it, each part once the new one is complete)."""
    if resume and overwrite:
        raise ValueError("--resume continues the earlier run and --overwrite replaces it: pass one")
    out = Path(out_dir)
    earlier = [p for p in (out / f"train-{task}", out / f"train_state-{task}", out / f"world-{task}") if p.exists()]
    if earlier and not (resume or overwrite):
        raise FileExistsError(
            f"--out {out} holds an earlier {task} run ({', '.join(p.name for p in earlier)}); "
            "pass --resume to continue it or --overwrite to replace it"
        )
