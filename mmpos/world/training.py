"""Training the world's models: the VAE (reconstruction + KL) and Flux transformers (rectified flow).

:func:`train` runs one task (:class:`~mmpos.world.trainer.WorldTrainer`) until its step or time budget or SIGTERM.
The pieces: :mod:`.latents` (packing, ids), :mod:`.training_data`, :mod:`.losses`, :mod:`.checkpoints`
(loading trained models), :mod:`.trainer` (the loop, EMA, resume), :mod:`.export` (writing the model).
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

from .trainer import ALL_TASKS, DEFAULTS, WorldTrainer

__all__ = ["ALL_TASKS", "DEFAULTS", "WorldTrainer", "stop_on_sigterm", "train"]


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


def train(config: dict, out_dir, resume: bool = False, progress: bool = True) -> dict:
    """Train ``config['task']``; write the model (EMA weights), model card and samples under ``out_dir``.

    Stops at ``max_steps``, after ``max_minutes`` of training or on SIGTERM. Returns the model card, whose
    ``val_loss_start`` is the validation loss of the starting weights (random, or ``init_from``'s on this run's
    validation data: then equal to the previous card's ``val_loss`` when the data are the same), measured before the
    first step and kept by ``resume``; ``val_loss`` is the final EMA weights'. Validation uses fixed examples, sigmas
    and noise (:func:`~mmpos.world.losses.validation_loss`), so values of different runs compare.
    """
    trainer = WorldTrainer(config, out_dir, progress)
    if resume:
        trainer.load_state()
    with stop_on_sigterm() as signals:
        trainer.run(signals)
    trainer.save_state()
    return trainer.finish()
