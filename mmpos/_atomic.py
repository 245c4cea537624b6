"""Files and folders written under a temporary name and renamed into place: a crash never leaves a half-written
file or folder (a checkpoint, an export, a dataset) under the name the user asked for, nor destroys the previous one.

A file writer not told to replace (``replace=False``) publishes with an exclusive create: what appeared under the
name meanwhile (another process's output) is kept and :class:`OutputTakenError` raised. A command's output folder
(:func:`output_folder_written`) is written under a lock beside it (``.<name>.lock``, released by the kernel if the
process dies): a second writer of the same folder gets :class:`ConcurrentWriteError` at once. A command claims its
``--out`` (file or folder) for its whole run (:func:`claimed_outputs`, :func:`claim_output`: the same lock), so two
commands writing one output never both run, whatever files each writes into it."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator


class OutputTakenError(FileExistsError):
    """The output a writer was not told to replace exists (or appeared while it worked)."""


class ConcurrentWriteError(FileExistsError):
    """Another process is writing the same output folder now."""


@contextmanager
def written_atomically(path, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (hidden, unique to this writer, same suffix, so writers that pick
    the format by it still do); on leaving the block it is renamed onto ``path``, or removed if the block raised.
    Parent folders are made. With ``replace=False`` a file at ``path`` (there before, or written meanwhile by
    another process) is kept and :class:`OutputTakenError` raised.

        with written_atomically(out / "video.mp4") as temporary:
            write_video(temporary)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not replace and path.exists():
        raise _taken(path)
    # unique to this writer (two writers never share one); not created here, so the writer's file gets the
    # usual permissions
    temporary = path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}.partial{path.suffix}")
    try:
        yield temporary
        _publish_file(temporary, path, replace)
    except OSError as error:  # disk full, ...: name the file the user asked for, not the temporary one
        if error.errno is None or error.filename not in (None, str(temporary), temporary):
            raise
        raise OSError(error.errno, error.strerror or os.strerror(error.errno), str(path)) from error
    finally:
        temporary.unlink(missing_ok=True)


def _publish_file(temporary: Path, path: Path, replace: bool) -> None:
    if replace:
        os.replace(temporary, path)
        return
    try:
        os.link(temporary, path)  # an exclusive create: fails if anything is at ``path``
    except FileExistsError:
        raise _taken(path) from None
    except OSError:  # no hard links on this file system: the check and the rename are not one step here
        if path.exists():
            raise _taken(path) from None
        os.replace(temporary, path)


def _taken(path: Path) -> OutputTakenError:
    return OutputTakenError(f"{path} exists and was kept: choose another --out or pass --overwrite")


@contextmanager
def folder_written_atomically(path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; on leaving the block it takes ``path``'s place (see
    :func:`replace_folder`), or is removed if the block raised. A kill at any moment leaves the previous folder
    or the new one, complete, under ``path`` (or the previous one beside it, which :func:`recover_folder` puts
    back). For a folder one job replaces (a training state, which all processes of one accelerate run write
    together); a command's output folder is :func:`output_folder_written` (locked, refused unless overwrite).

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


@contextmanager
def output_folder_written(path, overwrite: bool, option: str = "--out") -> Iterator[Path]:
    """:func:`folder_written_atomically` for a command's output folder: the whole write holds
    :func:`output_lock` on ``path`` (a second writer gets :class:`ConcurrentWriteError` at once), and a ``path``
    holding files is refused unless ``overwrite`` (:func:`check_new_output`, checked again under the lock: what
    another process finished meanwhile is kept). Two writers into one new folder: one wins whole, the other gets
    a named error, never a half or mixed folder.

        with output_folder_written(args.out, args.overwrite) as folder:
            write_dataset(folder)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(path):
        check_new_output(path, overwrite, option)
        with folder_written_atomically(path) as temporary:
            yield temporary


@contextmanager
def output_lock(path) -> Iterator[Path]:
    """Hold an exclusive lock on the output ``path`` (the file ``.<name>.lock`` beside it, removed on leaving;
    the kernel releases it if the process dies); raise :class:`ConcurrentWriteError` if another process holds it."""
    import fcntl

    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    if _claimed_here(path):  # the running command claimed it for its whole run (claim_output)
        yield lock
        return
    for _ in range(5):  # a lock file unlinked by a finishing writer between our open and our flock: open again
        handle = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(handle)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConcurrentWriteError(
                    f"{path}: another process is writing it now (it holds {lock}); wait for "
                    "it to finish or choose another --out"
                ) from None
            raise
        try:
            same = os.fstat(handle).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(handle)
    else:
        raise ConcurrentWriteError(f"{path}: other processes keep taking its lock {lock}; choose another --out")
    try:
        yield lock
    finally:
        lock.unlink(missing_ok=True)  # while still held: a waiting writer reopens a fresh file (the check above)
        os.close(handle)


_claimed: dict[Path, ExitStack] = {}  # outputs held for a whole command (claim_output): the scope holding each
_scopes: list[ExitStack] = []  # the open claimed_outputs scopes, innermost (the running command) last


def _lock_key(path: Path) -> Path:
    return Path(os.path.abspath(path))


def _claimed_here(path: Path) -> bool:
    """``path`` is claimed by the innermost scope (a nested command in this process is another writer)."""
    return bool(_scopes) and _claimed.get(_lock_key(path)) is _scopes[-1]


@contextmanager
def claimed_outputs() -> Iterator[None]:
    """The scope of one command: what :func:`claim_output` claims inside it stays claimed until the scope ends (the
    lock files removed, the parent folders the claims made removed again if still empty)."""
    with ExitStack() as stack:
        _scopes.append(stack)
        try:
            yield
        finally:
            _scopes.remove(stack)


def claim_output(path) -> Path:
    """Hold :func:`output_lock` on the output ``path`` (a file or folder, existing or not) until the enclosing
    :func:`claimed_outputs` ends, so a second process writing ``path`` meanwhile gets :class:`ConcurrentWriteError`
    naming it at once (nested ``output_lock`` / :func:`output_folder_written` of ``path`` in this process pass).
    Missing parent folders are made (the lock file lies beside ``path``). Outside a scope, or where no lock can be
    made (a file in the way, a read-only place: the command's own check names that), nothing is claimed."""
    path = Path(path)
    if not _scopes or _claimed_here(path):
        return path
    stack = _scopes[-1]
    made = [p for p in reversed(path.parents) if not p.exists()]
    stack.callback(_remove_if_empty, made)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        stack.enter_context(output_lock(path))
    except ConcurrentWriteError:
        raise
    except OSError:
        return path
    _claimed[_lock_key(path)] = stack
    stack.callback(_claimed.pop, _lock_key(path), None)
    return path


@contextmanager
def claimed_output(*paths) -> Iterator[None]:
    """A :func:`claimed_outputs` scope claiming ``paths`` (``None`` skipped): for a script's one command.

    with claimed_output(args.out):  # ConcurrentWriteError (a FileExistsError) if another process writes it
        write_report(args.out)
    """
    with claimed_outputs():
        for path in paths:
            if path is not None:
                claim_output(path)
        yield


def _remove_if_empty(folders: list[Path]) -> None:
    for folder in reversed(folders):  # deepest first
        try:
            folder.rmdir()
        except OSError:
            return


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
        raise OutputTakenError(f"{option} {path}: this {kind}; choose another {option} or pass --overwrite")
    return path
