"""Run folders and atomic checkpoints of the ViT trainer, without pickle.

``checkpoints/step_0000500`` holds the training state in files that load no code: ``model.safetensors``,
``optimizer.safetensors`` + ``optimizer.json``, ``ema.safetensors`` (with ``ema_decay``), ``trainer_state.json``
(progress, scheduler, accelerate's step, the fp16 grad scaler) and one ``rng_<process>.json`` per process (python,
numpy and torch generators). It is written as ``checkpoints/.step_0000500.tmp`` and renamed into place once
complete, so a crash never leaves a half-written checkpoint under a real name; the newest ``keep`` complete
checkpoints are kept. Checkpoints of earlier versions (accelerate's ``save_state``: ``optimizer.bin``,
``random_states_N.pkl``, ``custom_checkpoint_N.pkl``) are read with ``torch.load(weights_only=True)``: a file in them
holding anything but tensors and plain values is refused naming it (accelerate itself unpickles custom objects).
"""
from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .._safe_state import (UnsafeStateError, join_optimizer_state, load_torch_file, read_json, read_tensors,
                           rng_state, set_rng_state, split_optimizer_state, write_json, write_tensors)
from .run_folders import (STEP_DIR, RunExistsError, UnreadableCheckpointError, check_run_folder,  # noqa: F401
                          checkpoints, latest_checkpoint)
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


def _write_state(accelerator, state: TrainingState, folder: Path) -> None:
    """Every process writes its RNG file; the main process the rest (the same on every process under DDP)."""
    write_json(folder / f"rng_{accelerator.process_index}.json", rng_state())
    if not accelerator.is_main_process:
        return
    from safetensors.torch import save_model

    save_model(plain_model(accelerator, state.model), str(folder / "model.safetensors"))
    tensors, rest = split_optimizer_state(state.optimizer.state_dict())
    write_tensors(folder / "optimizer.safetensors", tensors)
    write_json(folder / "optimizer.json", rest)
    if state.ema is not None:
        save_model(state.ema, str(folder / "ema.safetensors"))
    scaler = getattr(accelerator, "scaler", None)
    write_json(folder / "trainer_state.json", {
        "format": FORMAT, "progress": state.progress.state_dict(), "scheduler": state.scheduler.state_dict(),
        "accelerator_step": accelerator.step, "scaler": None if scaler is None else scaler.state_dict()})


def load_checkpoint(accelerator, folder, state: TrainingState) -> None:
    """Restore ``state`` (and this process's RNG, accelerate's step) from ``folder``; a missing, truncated,
    foreign or unsafe checkpoint raises :class:`UnreadableCheckpointError` naming the file."""
    folder = Path(folder)
    try:
        if (folder / "trainer_state.json").is_file():
            _read_state(accelerator, folder, state)
        elif (folder / "optimizer.bin").is_file():
            _read_accelerate_state(accelerator, folder, state)
        else:
            raise UnsafeStateError(f"{folder}: not a checkpoint of the ViT trainer (no trainer_state.json)")
    except UnsafeStateError as error:
        raise UnreadableCheckpointError(f"cannot be resumed: {error}") from None
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as error:  # parts that do not fit
        message = " ".join(str(error).split())
        raise UnreadableCheckpointError(f"{folder}: cannot be resumed ({type(error).__name__}: {message})") from None


def _load_model(model, path: Path, device) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    if not path.is_file():
        raise UnsafeStateError(f"{path}: missing")
    try:
        load_model(model, str(path), device=str(device))
    except (OSError, RuntimeError, ValueError, SafetensorError) as error:
        raise UnsafeStateError(f"{path}: cannot be read ({type(error).__name__}: {' '.join(str(error).split())})") \
            from None


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
    _restore_rest(accelerator, state, saved["scheduler"], saved["progress"], saved["accelerator_step"],
                  saved.get("scaler"))
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
    """Refuse to write into an existing run without ``resume`` / ``overwrite``; ``overwrite`` empties it."""
    exists = check_run_folder(run_dir, resume, overwrite)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if exists and overwrite:
            shutil.rmtree(run_dir)
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()


def save_checkpoint(accelerator, run_dir, step: int, state: TrainingState, keep: int = 2) -> Path:
    """``state`` into a temporary folder, renamed to ``checkpoints/step_{step:07d}``."""
    folder = Path(run_dir) / "checkpoints"
    final = folder / f"step_{step:07d}"
    tmp = folder / f".step_{step:07d}.tmp"
    if accelerator.is_main_process:
        if tmp.exists():
            shutil.rmtree(tmp)  # left over by a crash
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    _write_state(accelerator, state, tmp)  # every process writes its RNG state
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final
