"""A ViT run folder and its complete checkpoints, without torch: the command line checks ``--resume`` /
``--overwrite`` before anything heavy is imported (:mod:`.checkpoints` writes and reads them). Checkpoints are the
scaffold's ``checkpoint-<N>/``; those of earlier versions, ``checkpoints/step_<N>``, are found too."""

from __future__ import annotations

import os
import re
from pathlib import Path

STEP_DIR = re.compile(r"^step_(\d+)$")  # the earlier layout, under checkpoints/
CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


class RunExistsError(FileExistsError):
    """The run folder exists and neither resume nor overwrite was asked."""


class UnreadableCheckpointError(ValueError):
    """A checkpoint folder whose files are missing, truncated, foreign or unsafe (pickled objects)."""


def refuse_earlier_run(holder: str | None, resume: bool, overwrite: bool) -> None:
    """Every trainer's ``--resume`` / ``--overwrite`` rule (nothing is written): both together, or neither over an
    earlier run, is :class:`RunExistsError`. ``holder``: what holds the earlier run, the message's start
    (``"--out runs/x holds an earlier run (checkpoint-4, ...)"``); None when there is none."""
    if resume and overwrite:
        raise RunExistsError("--resume continues the earlier run and --overwrite replaces it: pass one")
    if holder and not (resume or overwrite):
        raise RunExistsError(f"{holder}; pass --resume to continue it or --overwrite to replace it")


def check_run_folder(run_dir: Path, resume: bool, overwrite: bool) -> bool:
    """:class:`RunExistsError` / ``FileNotFoundError`` for a run folder that cannot be used as asked (nothing is
    written); returns whether it exists and holds files."""
    exists = run_dir.is_dir() and any(run_dir.iterdir())
    refuse_earlier_run(f"run folder {run_dir} exists" if exists else None, resume, overwrite)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunExistsError(f"run folder {run_dir} is a file; choose another --output-dir")
    if overwrite and run_dir.is_symlink():  # rmtree refuses links; the target is not ours to empty
        raise RunExistsError(
            f"--output-dir {run_dir}: a symbolic link (to {os.readlink(run_dir)}); --overwrite "
            "does not empty a link's target (left untouched): pass the real folder"
        )
    if resume and latest_checkpoint(run_dir) is None:
        raise FileNotFoundError(f"--resume: no complete checkpoint-<step> under {run_dir}")
    return exists


def checkpoints(run_dir) -> list[Path]:
    """Complete checkpoints of a run, oldest first (of one step, the scaffold's ``checkpoint-<N>`` last)."""
    found = []
    for layout, (folder, pattern) in enumerate(
        ((Path(run_dir) / "checkpoints", STEP_DIR), (Path(run_dir), CHECKPOINT_DIR))
    ):
        if folder.is_dir():
            found += [
                (int(m.group(1)), layout, p) for p in folder.iterdir() if (m := pattern.match(p.name)) and p.is_dir()
            ]
    return [p for *_, p in sorted(found)]


def latest_checkpoint(run_dir) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None
