"""A scaffold run folder (``--out``) and its complete checkpoints ``checkpoint-<step>/``, without torch: the command
line refuses an existing run (without ``--resume`` / ``--overwrite``) before anything heavy is imported.

A checkpoint being written is ``.checkpoint-<step>.partial`` and only renamed once complete, so every folder
named ``checkpoint-<step>`` is whole."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from .run_folders import RunExistsError, UnreadableCheckpointError, refuse_earlier_run  # noqa: F401 - one rule

CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


def checkpoints(out) -> list[Path]:
    """Complete checkpoints ``checkpoint-<step>`` of a run, oldest first."""
    out = Path(out)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if (m := CHECKPOINT_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(out) -> Path | None:
    found = checkpoints(out)
    return found[-1] if found else None


def kept_checkpoint_note(kept: Path | None) -> str:
    """The end of a stopped run's error (the NaN stop): the newest complete checkpoint ``kept``, which ``--resume``
    continues from, or that there is none yet."""
    return (
        f"The last checkpoint, {kept}, is kept (--resume continues from it)."
        if kept
        else "No checkpoint was written yet."
    )


def check_run(out, resume: str | None, overwrite: bool, outputs: tuple[str, ...] = ()) -> Path | None:
    """Check ``--out`` against ``--resume`` / ``--overwrite`` (nothing is written or deleted here).

    Returns the checkpoint to resume from (``resume``: ``"latest"`` or a folder), or None for a new run. An earlier
    run (a checkpoint or one of the task's ``outputs``) without either flag is :class:`RunExistsError`; ``--resume``
    without a complete checkpoint ``FileNotFoundError``."""
    out = Path(out)
    earlier = earlier_run(out, outputs)  # none when out is a file
    refuse_earlier_run(
        f"--out {out} holds an earlier run ({earlier[0].name}, ...)" if earlier else None, resume, overwrite
    )
    if out.exists() and not out.is_dir():
        raise RunExistsError(f"--out {out} is a file; expected a folder")
    if not resume:
        return None
    found = latest_checkpoint(out) if resume == "latest" else Path(resume)
    if found is None:
        raise FileNotFoundError(f"--resume: no complete checkpoint-<step> under {out}")
    if not found.is_dir() or not CHECKPOINT_DIR.match(found.name):
        raise FileNotFoundError(f"--resume {resume}: no such checkpoint-<step> folder")
    return found


def earlier_run(out: Path, outputs: tuple[str, ...] = ()) -> list[Path]:
    """What an earlier run left in ``out``: its checkpoints (also partial ones), log and the task's outputs."""
    if not out.is_dir():
        return []
    names = ("log.jsonl", ".run", *outputs)
    return sorted(p for p in out.iterdir() if CHECKPOINT_DIR.match(p.name.strip(".").removesuffix(".partial"))) + [
        out / name for name in names if (out / name).exists()
    ]


def remove_earlier_run(out, outputs: tuple[str, ...] = ()) -> None:
    """``--overwrite``: delete the earlier run's checkpoints, log and outputs (nothing else in ``out``)."""
    remove_paths(earlier_run(Path(out), outputs))


def remove_paths(paths) -> None:
    """Delete these files and folders (an earlier run's, on ``--overwrite``)."""
    for path in map(Path, paths):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
