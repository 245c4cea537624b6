"""The scaffold's one checkpoint layout, ``checkpoint-<step>/``, written atomically and verified as one step.

A checkpoint holds (no pickle anywhere: safetensors and JSON):

* ``model.safetensors`` (the trained module, unwrapped), ``optimizer.safetensors`` + ``optimizer.json``,
  ``ema.safetensors`` (when the run keeps an EMA), ``config.yaml`` (the resolved config) and ``progress.json``
  (step, data-stream position, LR scheduler, grad scaler, process count and the size of every file) -- written by
  the main process;
* ``rng_<process>.json`` (python, numpy and torch generators, with the step) -- one per process, each written by
  its process.

Order: the main process empties ``.checkpoint-<step>.partial``; barrier; every process writes its RNG file, the
main process the rest; barrier; the main process checks every process's file is there, writes ``progress.json``
last and renames the folder into place (an older folder of the name is replaced whole); barrier. On resume every
file is checked against ``progress.json`` (present, of the recorded size, the RNG file of the same step), so a
folder mixing steps or processes is refused by name.

Checkpoints of earlier layouts are read too, every torch file with ``weights_only=True`` (a file holding anything
but tensors and plain values is refused naming it), and resume as the scaffold's do:

* the ViT trainer's before the scaffold, ``checkpoints/step_<N>/`` with ``trainer_state.json`` (progress,
  scheduler, accelerate's step, grad scaler) and plain ``rng_<process>.json``;
* accelerate's ``save_state`` (``model.safetensors``, ``optimizer.bin``, ``random_states_<N>.pkl``): the ViT
  trainer's with its scheduler, progress and EMA registered as ``custom_checkpoint_0/1/2.pkl``; the DiT and
  camera-adapter scripts' with an ``ema.safetensors`` or ``custom_checkpoint_0.pkl`` and a ``step.json``.
"""

from __future__ import annotations

import shutil
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from ..._atomic import replace_folder
from ..._safe_state import (
    UnsafeStateError,
    join_optimizer_state,
    load_torch_file,
    read_json,
    read_tensors,
    rng_state,
    set_rng_state,
    split_optimizer_state,
    write_json,
    write_tensors,
)
from .folders import CHECKPOINT_DIR, UnreadableCheckpointError, checkpoints
from .processes import UnshareOutError

FORMAT = 1


@dataclass
class RunState:
    """What a checkpoint holds: the prepared model (any wrapper) and optimizer, an LR scheduler (or None), the
    EMA (or None), the step and the data-stream position (a task's progress: JSON values)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object | None = None
    ema: torch.nn.Module | None = None
    step: int = 0
    data: dict = field(default_factory=dict)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a quota): nothing was replaced, the earlier checkpoints are
    intact and the partial folder is removed."""


def save_checkpoint(accelerator, out, state: RunState, config: dict, keep: int = 2, extras=None) -> Path:
    """``state`` as ``out/checkpoint-<step>`` (see the module docstring); ``extras(folder)`` (main process) adds
    task files (an exported adapter). The newest ``keep`` checkpoints are kept. A failed write raises
    :class:`CheckpointWriteError` naming the checkpoint, the cause and the newest intact one."""
    out = Path(out)
    final = out / f"checkpoint-{state.step}"
    partial = out / f".checkpoint-{state.step}.partial"
    try:
        if accelerator.is_main_process:
            shutil.rmtree(partial, ignore_errors=True)  # left over by a killed run
            partial.mkdir(parents=True)
        accelerator.wait_for_everyone()
        write_json(partial / f"rng_{accelerator.process_index}.json", {"step": state.step, "rng": rng_state()})
        if accelerator.is_main_process:
            _write_main_files(accelerator, partial, state, config, extras)
    except Exception as error:  # noqa: BLE001 - re-raised, named: safetensors and torch raise their own types
        shutil.rmtree(partial, ignore_errors=True)  # a partial folder is never a checkpoint; free what it took
        earlier = checkpoints(out)
        kept = f"the newest checkpoint, {earlier[-1].name}, is intact" if earlier else "no earlier checkpoint"
        cause = " ".join(str(error).split()) or type(error).__name__
        raise CheckpointWriteError(
            f"{final}: the checkpoint could not be written ({cause}); {kept}; free space and resume with --resume"
        ) from error
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _write_progress(accelerator, partial, state)
        replace_folder(partial, final)
        for old in [c for c in checkpoints(out) if CHECKPOINT_DIR.match(c.name)][:-keep]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def _write_main_files(accelerator, folder: Path, state: RunState, config: dict, extras) -> None:
    from safetensors.torch import save_model

    save_model(accelerator.unwrap_model(state.model), str(folder / "model.safetensors"))
    tensors, rest = split_optimizer_state(state.optimizer.state_dict())
    write_tensors(folder / "optimizer.safetensors", tensors)
    write_json(folder / "optimizer.json", rest)
    if state.ema is not None:
        save_model(state.ema, str(folder / "ema.safetensors"))
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=True), encoding="utf-8")
    if extras is not None:
        extras(folder)


def _write_progress(accelerator, folder: Path, state: RunState) -> None:
    missing = [f"rng_{r}.json" for r in range(accelerator.num_processes) if not (folder / f"rng_{r}.json").is_file()]
    if missing:  # a process wrote into a folder the main process does not see: --out is not shared
        raise UnshareOutError(
            f"{folder}: {', '.join(missing)} missing after every process wrote its part; --out "
            "must be one folder every node sees (shared storage)"
        )
    scaler = getattr(accelerator, "scaler", None)
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    write_json(
        folder / "progress.json",
        {
            "format": FORMAT,
            "step": state.step,
            "data": state.data,
            "num_processes": accelerator.num_processes,
            "scheduler": None if state.scheduler is None else state.scheduler.state_dict(),
            "scaler": None if scaler is None else scaler.state_dict(),
            "files": files,
        },
    )


def load_checkpoint(accelerator, folder, state: RunState) -> dict:
    """Restore ``state`` (and this process's generators) from ``folder``; returns the run's saved config (``{}``
    for a checkpoint of an earlier layout). A missing, truncated, mixed, foreign or unsafe checkpoint raises
    :class:`UnreadableCheckpointError` naming the file."""
    folder = Path(folder)
    with reading_checkpoint(folder):
        if (folder / "progress.json").is_file():
            return _read(accelerator, folder, state)
        if (folder / "trainer_state.json").is_file():
            _read_trainer_state(accelerator, folder, state)
        elif (folder / "custom_checkpoint_1.pkl").is_file():
            _read_accelerate_progress_layout(accelerator, folder, state)
        elif (folder / "optimizer.bin").is_file():
            _read_accelerate_layout(accelerator, folder, state)
        else:
            raise UnsafeStateError(f"{folder}: not a training checkpoint (no progress.json)")
        return {}


@contextmanager
def reading_checkpoint(folder: Path):
    """Reading the checkpoint ``folder``: an unsafe part, or parts that do not fit the run, raise one
    :class:`UnreadableCheckpointError` naming the folder (one line)."""
    try:
        yield
    except UnsafeStateError as error:
        raise UnreadableCheckpointError(f"{folder}: cannot be resumed ({error})") from None
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as error:  # parts that do not fit
        message = " ".join(str(error).split())
        raise UnreadableCheckpointError(f"{folder}: cannot be resumed ({type(error).__name__}: {message})") from None


def saved_config(folder) -> dict:
    """The resolved config a checkpoint was written with (``{}`` for a checkpoint of an earlier layout)."""
    path = Path(folder) / "config.yaml"
    if not path.is_file():
        return {}
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise UnreadableCheckpointError(f"{path}: cannot be read ({' '.join(str(error).split())})") from None


def verify(folder: Path, process_index: int) -> dict:
    """``progress.json`` after checking the folder is one step: its name, every recorded file and its size, and
    this process's RNG file (written at the same step)."""
    progress = read_json(folder / "progress.json")
    if progress.get("format") != FORMAT:
        raise UnsafeStateError(f"{folder / 'progress.json'}: format {progress.get('format')!r}, expected {FORMAT}")
    match = CHECKPOINT_DIR.match(folder.name)
    if match and int(match.group(1)) != progress["step"]:
        raise UnsafeStateError(f"{folder}: progress.json is of step {progress['step']}, not of this folder's")
    for name, size in progress["files"].items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            found = "missing" if not path.is_file() else f"{path.stat().st_size} bytes, recorded {size}"
            raise UnsafeStateError(f"{path}: {found} (the checkpoint is not one complete step)")
    rng = folder / f"rng_{process_index}.json"
    if rng.is_file() and read_json(rng).get("step") != progress["step"]:
        raise UnsafeStateError(f"{rng}: of step {read_json(rng).get('step')}, the checkpoint of {progress['step']}")
    return progress


def _read(accelerator, folder: Path, state: RunState) -> dict:
    progress = verify(folder, accelerator.process_index)
    _load_model(accelerator.unwrap_model(state.model), folder / "model.safetensors", accelerator.device)
    live = state.optimizer.state_dict()
    tensors = read_tensors(folder / "optimizer.safetensors", "cpu")  # the optimizer moves them to its params
    state.optimizer.load_state_dict(join_optimizer_state(tensors, read_json(folder / "optimizer.json"), live))
    if state.ema is not None:
        _load_model(state.ema, folder / "ema.safetensors", next(state.ema.parameters()).device)
    if state.scheduler is not None and progress.get("scheduler") is not None:
        state.scheduler.load_state_dict(progress["scheduler"])
    scaler = getattr(accelerator, "scaler", None)
    if scaler is not None and progress.get("scaler") is not None:
        scaler.load_state_dict(progress["scaler"])
    state.step, state.data = int(progress["step"]), dict(progress["data"])
    _restore_rng(folder / f"rng_{accelerator.process_index}.json", lambda saved: saved["rng"])
    return saved_config(folder)


def _restore_rng(path: Path, unpack) -> None:
    if path.is_file():
        set_rng_state(unpack(read_json(path) if path.suffix == ".json" else load_torch_file(path, allow_numpy=True)))
    else:
        warnings.warn(f"{path}: missing (the run had fewer processes); the generators are not restored", stacklevel=3)


def _load_model(model, path: Path, device) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    if not path.is_file():
        raise UnsafeStateError(f"{path}: missing")
    try:
        load_model(model, str(path), device=str(device))
    except (OSError, RuntimeError, ValueError, SafetensorError) as error:
        raise UnsafeStateError(
            f"{path}: cannot be read ({type(error).__name__}: {' '.join(str(error).split())})"
        ) from None


def _read_accelerate_layout(accelerator, folder: Path, state: RunState) -> None:
    """A checkpoint of ``accelerator.save_state`` (earlier DiT and camera-adapter scripts): the step from
    ``step.json`` or the folder's name, the EMA from ``ema.safetensors`` or ``custom_checkpoint_0.pkl``."""
    plain = accelerator.unwrap_model(state.model)
    weights = read_tensors(folder / "model.safetensors", accelerator.device)
    plain.load_state_dict({k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in weights.items()})
    state.optimizer.load_state_dict(load_torch_file(folder / "optimizer.bin", "cpu"))
    if state.ema is not None:
        if (folder / "ema.safetensors").is_file():
            _load_model(state.ema, folder / "ema.safetensors", next(state.ema.parameters()).device)
        else:
            state.ema.load_state_dict(load_torch_file(folder / "custom_checkpoint_0.pkl", accelerator.device))
    step_file = folder / "step.json"
    match = CHECKPOINT_DIR.match(folder.name)
    if step_file.is_file():
        state.step = int(read_json(step_file)["step"])
    elif match:
        state.step = int(match.group(1))
    else:
        raise UnsafeStateError(f"{folder}: no step.json and not named checkpoint-<step>")
    state.data = {}
    _restore_rng(folder / f"random_states_{accelerator.process_index}.pkl", lambda saved: saved)


def _restore_progress(accelerator, state: RunState, scheduler, progress: dict, step: int, scaler) -> None:
    """An earlier layout's scheduler, progress (``state.data``, with accelerate's step) and grad scaler."""
    state.scheduler.load_state_dict(scheduler)
    state.step, state.data = int(progress.get("step", 0)), {**progress, "accelerator_step": int(step)}
    if scaler is not None and getattr(accelerator, "scaler", None) is not None:
        accelerator.scaler.load_state_dict(scaler)


def _read_trainer_state(accelerator, folder: Path, state: RunState) -> None:
    """The ViT trainer's layout before the scaffold: ``trainer_state.json`` and plain ``rng_<process>.json``."""
    saved = read_json(folder / "trainer_state.json")
    if saved.get("format") != FORMAT:
        raise UnsafeStateError(f"{folder / 'trainer_state.json'}: format {saved.get('format')!r}, expected {FORMAT}")
    _load_model(accelerator.unwrap_model(state.model), folder / "model.safetensors", accelerator.device)
    live = state.optimizer.state_dict()
    tensors = read_tensors(folder / "optimizer.safetensors", "cpu")  # as accelerate: the optimizer moves them
    state.optimizer.load_state_dict(join_optimizer_state(tensors, read_json(folder / "optimizer.json"), live))
    if state.ema is not None:
        _load_model(state.ema, folder / "ema.safetensors", next(state.ema.parameters()).device)
    _restore_progress(
        accelerator, state, saved["scheduler"], saved["progress"], saved["accelerator_step"], saved.get("scaler")
    )
    _restore_rng(folder / f"rng_{accelerator.process_index}.json", lambda saved: saved)


def _read_accelerate_progress_layout(accelerator, folder: Path, state: RunState) -> None:
    """The ViT trainer's ``accelerator.save_state``, with the scheduler, progress and EMA registered (in that order)
    as ``custom_checkpoint_0/1/2.pkl``."""
    plain = accelerator.unwrap_model(state.model)
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
    _restore_progress(accelerator, state, scheduler, progress, rng_saved.get("step", 0), scaler)
    if rng_saved:
        set_rng_state(rng_saved)
