"""Files and folders written under a temporary name and renamed into place: a crash never leaves a half-written
file or folder (a checkpoint, an export, a dataset) under the name the user asked for, nor destroys the previous one."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def written_atomically(path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (hidden, same suffix, so writers that pick the format by it still
    do); on leaving the block it is renamed onto ``path``, or removed if the block raised. Parent folders are made.

        with written_atomically(out / "video.mp4") as temporary:
            write_video(temporary)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        yield temporary
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)


@contextmanager
def folder_written_atomically(path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; on leaving the block it takes ``path``'s place (see
    :func:`replace_folder`), or is removed if the block raised. A kill at any moment leaves the previous folder
    or the new one, complete, under ``path`` (or the previous one beside it, which :func:`recover_folder` puts
    back).

        with folder_written_atomically(out / "train_state") as folder:
            accelerator.save_state(str(folder))
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.partial")
    shutil.rmtree(temporary, ignore_errors=True)  # left over by a killed run
    temporary.mkdir()
    try:
        yield temporary
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    replace_folder(temporary, path)


def replace_folder(complete: Path, path: Path) -> None:
    """Rename the folder ``complete`` to ``path``; a folder already at ``path`` is moved aside first and deleted
    only once the new one is in place."""
    path = Path(path)
    previous = _previous_name(path)
    shutil.rmtree(previous, ignore_errors=True)
    if path.exists():
        os.replace(path, previous)
    os.replace(complete, path)
    shutil.rmtree(previous, ignore_errors=True)


def recover_folder(path) -> Path:
    """``path``, with the previous folder put back if a kill fell between :func:`replace_folder`'s two renames."""
    path = Path(path)
    previous = _previous_name(path)
    if not path.exists() and previous.is_dir():
        os.replace(previous, path)
    return path


def _previous_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.previous")


def check_new_output(path, overwrite: bool, option: str = "--out") -> Path:
    """``path``, unless it is a file or a folder holding files and ``overwrite`` is False: then
    ``FileExistsError`` naming it (a command never replaces what the user did not ask it to)."""
    path = Path(path)
    taken = path.is_file() or (path.is_dir() and any(path.iterdir()))
    if taken and not overwrite:
        kind = "folder holds files" if path.is_dir() else "file exists"
        raise FileExistsError(f"{option} {path}: this {kind}; choose another {option} or pass --overwrite")
    return path
