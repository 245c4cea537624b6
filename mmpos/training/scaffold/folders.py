"""A run folder (``--out``) and its complete checkpoints, without torch: a command line refuses an existing run
(without ``--resume`` / ``--overwrite``) before anything heavy is imported.

A checkpoint being written is ``.checkpoint-<step>.partial`` and only renamed once complete, so every folder
named ``checkpoint-<step>`` is whole. The ViT trainer's checkpoints of before the scaffold, ``checkpoints/step_<N>``,
are found too (and resumed: :mod:`.checkpoint`).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
STEP_DIR = re.compile(r"^step_(\d+)$")  # the ViT trainer's layout before the scaffold, under checkpoints/


class RunExistsError(FileExistsError):
    """The run folder exists and neither resume nor overwrite was asked."""


class UnreadableCheckpointError(ValueError):
    """A checkpoint folder whose files are missing, truncated, foreign or unsafe (pickled objects)."""


def checkpoints(out) -> list[Path]:
    """Complete checkpoints of a run, oldest first: ``checkpoint-<step>`` (of one step, after an earlier
    layout's ``checkpoints/step_<step>``)."""
    found = []
    for layout, (folder, pattern) in enumerate(((Path(out) / "checkpoints", STEP_DIR), (Path(out), CHECKPOINT_DIR))):
        if folder.is_dir():
            found += [
                (int(m.group(1)), layout, p) for p in folder.iterdir() if (m := pattern.match(p.name)) and p.is_dir()
            ]
    return [p for *_, p in sorted(found)]


def latest_checkpoint(out) -> Path | None:
    found = checkpoints(out)
    return found[-1] if found else None


def refuse_earlier_run(holder: str | None, resume: bool, overwrite: bool) -> None:
    """Every trainer's ``--resume`` / ``--overwrite`` rule (nothing is written): both together, or neither over an
    earlier run, is :class:`RunExistsError`. ``holder``: what holds the earlier run, the message's start
    (``"--out runs/x holds an earlier run (checkpoint-4, ...)"``); None when there is none."""
    if resume and overwrite:
        raise RunExistsError("--resume continues the earlier run and --overwrite replaces it: pass one")
    if holder and not (resume or overwrite):
        raise RunExistsError(f"{holder}; pass --resume to continue it or --overwrite to replace it")


def check_run_folder(run_dir: Path, resume: bool, overwrite: bool) -> bool:
    """The ViT trainer's rule for its ``--output-dir`` (any file there is an earlier run): :class:`RunExistsError`
    / ``FileNotFoundError`` for a run folder that cannot be used as asked (nothing is written); returns whether it
    exists and holds files."""
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
