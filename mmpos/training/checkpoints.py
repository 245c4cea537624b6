"""Run folders and atomic checkpoints of the ViT trainer, without pickle: the training scaffold's layout.

``checkpoint-500/`` (:mod:`.scaffold_checkpoint`: ``model.safetensors``, ``optimizer.safetensors`` +
``optimizer.json``, ``ema.safetensors`` (with ``ema_decay``), ``config.yaml``, ``progress.json`` with the trainer's
progress (step, epoch, batch, micro-batch, accelerate's step) as the data-stream position, the scheduler and the
fp16 grad scaler, and one ``rng_<process>.json`` per process), written as ``.checkpoint-500.partial`` and renamed
into place once complete; the newest ``keep`` complete checkpoints are kept. Run folders of earlier versions still
resume: ``checkpoints/step_0000500`` with ``trainer_state.json`` (the previous layout) and accelerate's
``save_state`` folders (``optimizer.bin``, ``random_states_N.pkl``, ``custom_checkpoint_N.pkl``, read with
``torch.load(weights_only=True)``: a file holding anything but tensors and plain values is refused naming it).
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .._safe_state import (
    UnsafeStateError,
    join_optimizer_state,
    load_torch_file,
    read_json,
    read_tensors,
    set_rng_state,
)
from .run_folders import (  # noqa: F401
    STEP_DIR,
    RunExistsError,
    UnreadableCheckpointError,
    check_run_folder,
    checkpoints,
    latest_checkpoint,
)
from .vit_model import plain_model

FORMAT = 1


@dataclass
class TrainingState:
    """What a checkpoint holds: the prepared model (any wrapper) and optimizer, the timm scheduler, the
    trainer's progress (``state_dict`` / ``load_state_dict`` of JSON values) and the EMA model (or None)."""

    model: torch.nn.Module
    optimizer: object
    scheduler: object
    progress: object
    ema: torch.nn.Module | None = None


def _run_state(accelerator, state: TrainingState, step: int = 0):
    from .scaffold_checkpoint import RunState

    data = {**state.progress.state_dict(), "accelerator_step": accelerator.step}
    return RunState(plain_model(accelerator, state.model), state.optimizer, state.scheduler, state.ema, step, data)


def load_checkpoint(accelerator, folder, state: TrainingState) -> None:
    """Restore ``state`` (and this process's RNG, accelerate's step) from ``folder``; a missing, truncated,
    foreign or unsafe checkpoint raises :class:`UnreadableCheckpointError` naming the file."""
    folder = Path(folder)
    if (folder / "progress.json").is_file():  # the scaffold's layout
        from . import scaffold_checkpoint

        run = _run_state(accelerator, state)
        scaffold_checkpoint.load_checkpoint(accelerator, folder, run)
        data = dict(run.data)
        accelerator.step = int(data.pop("accelerator_step"))
        state.progress.load_state_dict(data)
        return
    from .scaffold_checkpoint import reading_checkpoint

    with reading_checkpoint(folder):
        if (folder / "trainer_state.json").is_file():
            _read_state(accelerator, folder, state)
        elif (folder / "optimizer.bin").is_file():
            _read_accelerate_state(accelerator, folder, state)
        else:
            raise UnsafeStateError(f"{folder}: not a checkpoint of the ViT trainer (no trainer_state.json)")


def _load_model(model, path: Path, device) -> None:
    from .scaffold_checkpoint import _load_model as load_model_file  # the one safetensors model reader

    load_model_file(model, path, device)


def _read_state(accelerator, folder: Path, state: TrainingState) -> None:
    saved = read_json(folder / "trainer_state.json")
    if saved.get("format") != FORMAT:
        raise UnsafeStateError(f"{folder / 'trainer_state.json'}: format {saved.get('format')!r}, expected {FORMAT}")
    _load_model(plain_model(accelerator, state.model), folder / "model.safetensors", accelerator.device)
    live = state.optimizer.state_dict()
    tensors = read_tensors(folder / "optimizer.safetensors", "cpu")  # as accelerate: the optimizer moves them
    state.optimizer.load_state_dict(join_optimizer_state(tensors, read_json(folder / "optimizer.json"), live))
    if state.ema is not None:
        _load_model(state.ema, folder / "ema.safetensors", next(state.ema.parameters()).device)
    _restore_rest(
        accelerator, state, saved["scheduler"], saved["progress"], saved["accelerator_step"], saved.get("scaler")
    )
    rng = folder / f"rng_{accelerator.process_index}.json"
    if rng.is_file():
        set_rng_state(read_json(rng))
    else:
        warnings.warn(f"{rng}: missing (the run had fewer processes); the generators are not restored", stacklevel=2)


def _restore_rest(accelerator, state, scheduler, progress, step, scaler) -> None:
    state.scheduler.load_state_dict(scheduler)
    state.progress.load_state_dict(progress)
    accelerator.step = int(step)
    if scaler is not None and getattr(accelerator, "scaler", None) is not None:
        accelerator.scaler.load_state_dict(scaler)


def _read_accelerate_state(accelerator, folder: Path, state: TrainingState) -> None:
    """A checkpoint of ``accelerator.save_state`` with the scheduler, progress and EMA registered (in that order)
    as ``custom_checkpoint_0/1/2.pkl``, every file read with ``weights_only=True``."""
    plain = plain_model(accelerator, state.model)
    weights = read_tensors(folder / "model.safetensors", accelerator.device)
    plain.load_state_dict({k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in weights.items()})
    state.optimizer.load_state_dict(load_torch_file(folder / "optimizer.bin", "cpu"))
    scheduler = load_torch_file(folder / "custom_checkpoint_0.pkl")
    progress = load_torch_file(folder / "custom_checkpoint_1.pkl")
    if state.ema is not None:
        state.ema.load_state_dict(load_torch_file(folder / "custom_checkpoint_2.pkl", accelerator.device))
    rng = folder / f"random_states_{accelerator.process_index}.pkl"
    rng_saved = load_torch_file(rng, allow_numpy=True) if rng.is_file() else {}
    scaler = load_torch_file(folder / "scaler.pt") if (folder / "scaler.pt").is_file() else None
    _restore_rest(accelerator, state, scheduler, progress, rng_saved.get("step", 0), scaler)
    if rng_saved:
        set_rng_state(rng_saved)


def prepare_run_folder(run_dir: Path, resume: bool, overwrite: bool, accelerator) -> None:
    """Refuse to write into an existing run without ``resume`` / ``overwrite``; ``overwrite`` empties it. Every
    process must see the folder (:func:`~.scaffold.check_shared_out`)."""
    from .scaffold import check_shared_out

    exists = check_run_folder(run_dir, resume, overwrite)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if exists and overwrite:
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    check_shared_out(accelerator, run_dir)


def save_checkpoint(
    accelerator, run_dir, step: int, state: TrainingState, keep: int = 2, config: dict | None = None
) -> Path:
    """``state`` as ``run_dir/checkpoint-{step}`` (:func:`.scaffold_checkpoint.save_checkpoint`)."""
    from . import scaffold_checkpoint

    return scaffold_checkpoint.save_checkpoint(
        accelerator, run_dir, _run_state(accelerator, state, step), config or {}, keep
    )
