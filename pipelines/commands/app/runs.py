"""Run an ``mmpos`` command in this process, as the command line would: the same root parser, the same ``run``.

The app never re-implements a pipeline: each button builds an argument list (``["edit", "band", "--model",
"world", ...]``), parses it with :func:`mmpos.pipelines.commands.build_parser` and calls the command's ``run``.
A user error ends a command with one line on stderr and exit code 2; :func:`run_command` turns it into
:class:`CommandError` carrying that line (the page shows it). One command runs at a time (the commands print
to the process' stdout and stderr, which a run captures).
"""

from __future__ import annotations

import contextlib
import io
import threading
from dataclasses import dataclass
from pathlib import Path

_RUN_LOCK = threading.Lock()
_running: int | None = None  # the thread running a command, for cancel_running


class CommandError(ValueError):
    """A command ended with a user error: ``str(error)`` is the line the command line prints (``mmpos edit band:
    error: ...``)."""


@dataclass
class CommandRun:
    """A finished command: its output folder ``out`` (the ``--out`` it was given) and what it printed."""

    out: Path
    log: str

    def file(self, name: str) -> Path | None:
        """``out / name`` when the command wrote it, else None."""
        path = self.out / name
        return path if path.is_file() else None


def parse_command(argv: list[str]):
    """``argv`` parsed by the root ``mmpos`` parser; a parse error is a :class:`CommandError` with argparse's line."""
    from .. import build_parser

    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return build_parser().parse_args(argv)
    except SystemExit:
        raise CommandError(_error_line(errors.getvalue())) from None


def run_command(argv: list[str], out: Path, call=None) -> CommandRun:
    """Run ``mmpos ARGV --out OUT`` in this process as ``mmpos`` does (:func:`mmpos.pipelines.commands.run_parsed`:
    ``--out`` claimed; ``call(args)``: the command's own ``run`` unless given); its user errors (exit code 2) become
    :class:`CommandError`, and :func:`cancel_running` interrupts it as Ctrl-C interrupts the command line."""
    global _running
    from .. import run_parsed

    args = parse_command([*argv, "--out", str(out)])
    printed, errors = io.StringIO(), io.StringIO()
    with _RUN_LOCK, contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
        _running = threading.get_ident()
        try:
            code = run_parsed(args, call)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 2
        except KeyboardInterrupt:
            raise CommandError(f"mmpos {' '.join(argv[:2])}: interrupted") from None
        finally:
            _running = None
    if code:
        raise CommandError(_error_line(errors.getvalue()) or f"mmpos {' '.join(argv[:2])}: exit code {code}")
    return CommandRun(out, printed.getvalue())


def _error_line(stderr: str) -> str:
    """The command's error line (the last line naming an error), else the last line it printed."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    named = [line for line in lines if "error:" in line]
    return (named or lines or [""])[-1]


def cancel_running() -> bool:
    """Interrupt the running command (a ``KeyboardInterrupt`` raised in its thread at its next Python step, as
    Ctrl-C does on the command line); False when none runs."""
    import ctypes

    thread = _running
    if thread is None:
        return False
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(KeyboardInterrupt))
    return True
