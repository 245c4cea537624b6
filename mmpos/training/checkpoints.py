"""Run folders and atomic accelerate checkpoints.

``checkpoints/step_0000500`` holds ``accelerator.save_state`` (model, optimizer, RNG states and every object
registered for checkpointing). It is written as ``checkpoints/.step_0000500.tmp`` and renamed into place
once complete, so a crash never leaves a half-written checkpoint under a real name; the newest ``keep``
complete checkpoints are kept.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

STEP_DIR = re.compile(r"^step_(\d+)$")


class RunExistsError(FileExistsError):
    """The run folder exists and neither resume nor overwrite was asked."""


class UnreadableCheckpointError(ValueError):
    """A checkpoint folder whose files are missing, truncated or foreign."""


def load_checkpoint(accelerator, folder) -> None:
    """``accelerator.load_state(folder)``; an unreadable checkpoint raises :class:`UnreadableCheckpointError`
    naming the folder (safetensors' and torch's own errors do not)."""
    from safetensors import SafetensorError

    try:
        accelerator.load_state(str(folder))
    except (OSError, EOFError, RuntimeError, ValueError, KeyError, SafetensorError) as error:
        message = " ".join(str(error).split())
        raise UnreadableCheckpointError(f"{folder}: cannot be resumed ({type(error).__name__}: {message})") from None


def prepare_run_folder(run_dir: Path, resume: bool, overwrite: bool, accelerator) -> None:
    """Refuse to write into an existing run without ``resume`` / ``overwrite``; ``overwrite`` empties it."""
    if resume and overwrite:
        raise RunExistsError("--resume and --overwrite exclude each other")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunExistsError(f"run folder {run_dir} is a file; choose another --output-dir")
    exists = run_dir.exists() and any(run_dir.iterdir())
    if exists and not (resume or overwrite):
        raise RunExistsError(f"run folder {run_dir} exists; pass --resume to continue it or --overwrite to "
                             f"replace it")
    if resume and latest_checkpoint(run_dir) is None:
        raise FileNotFoundError(f"--resume: no complete checkpoint under {run_dir / 'checkpoints'}")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if exists and overwrite:
            shutil.rmtree(run_dir)
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()


def checkpoints(run_dir) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(accelerator, run_dir, step: int, keep: int = 2) -> Path:
    """``accelerator.save_state`` into a temporary folder, renamed to ``checkpoints/step_{step:07d}``."""
    folder = Path(run_dir) / "checkpoints"
    final = folder / f"step_{step:07d}"
    tmp = folder / f".step_{step:07d}.tmp"
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)  # left over by a crash
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))  # every process writes its RNG state
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final
