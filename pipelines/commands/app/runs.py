"""Run an ``mmpos`` command in this process, as the command line would: the same root parser, the same ``run``.

The app never re-implements a pipeline: each button builds an argument list (``["edit", "band", "--model",
"world", ...]``), parses it with :func:`mmpos.pipelines.commands.build_parser` and calls the command's ``run``.
A user error ends a command with one line on stderr and exit code 2; :func:`run_command` turns it into
:class:`CommandError` carrying that line (the page shows it). One command runs at a time (the commands print
to the process' stdout and stderr, which a run captures).

Each of the page's jobs runs in a thread of its own (:func:`run_job`), so that :func:`cancel_running` can stop it
wherever it is (writing the camera path, loading the model, denoising) with Ctrl-C's ``KeyboardInterrupt``.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import io
import threading
from dataclasses import dataclass
from pathlib import Path

_RUN_LOCK = threading.Lock()  # one command at a time
_JOB_LOCK = threading.Lock()  # guards _job: a job is interrupted only while it runs its function
_job: threading.Thread | None = None  # the job cancel_running interrupts
CANCELLED = "cancelled: the job was stopped before it finished"
_KEPT_PIPELINES: dict = {}  # the app's last loaded pipeline, reused by the next run (mmpos.pipelines.kept_pipelines)


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
    :class:`CommandError`, as does Ctrl-C's ``KeyboardInterrupt`` (:func:`cancel_running`): :data:`CANCELLED`."""
    from mmpos.training.scaffold.interrupt import EXIT_CODE

    from .. import run_parsed

    args = parse_command([*argv, "--out", str(out)])
    printed, errors = io.StringIO(), io.StringIO()
    with _RUN_LOCK, contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
        try:
            code = run_parsed(args, call)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 2
    if code == EXIT_CODE:  # the command stopped on Ctrl-C (cancel_running) and said so
        raise CommandError(CANCELLED)
    if code:
        raise CommandError(_error_line(errors.getvalue()) or f"mmpos {' '.join(argv[:2])}: exit code {code}")
    return CommandRun(out, printed.getvalue())


def _error_line(stderr: str) -> str:
    """The command's error line (the last line naming an error), else the last line it printed."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    named = [line for line in lines if "error:" in line]
    return (named or lines or [""])[-1]


def run_job(function, *args, **kwargs):
    """``function(*args, **kwargs)`` in a thread of its own (with this thread's context variables: Gradio's progress
    tracking; the app's last loaded pipeline kept for the next job), waited for; :func:`cancel_running` interrupts it, which ends it as ``CommandError("cancelled")``."""
    global _job
    outcome: dict = {}
    context = contextvars.copy_context()

    def job() -> None:
        try:
            try:
                outcome["value"] = context.run(_keeping_pipelines, function, *args, **kwargs)
            finally:
                with _JOB_LOCK:  # from here on cancel_running leaves this thread alone
                    thread.finished = True
        except BaseException as error:  # noqa: BLE001  (handed to the waiting thread below)
            outcome["error"] = error

    thread = threading.Thread(target=job, name="mmpos-app-job", daemon=True)
    thread.finished = False  # type: ignore[attr-defined]
    with _JOB_LOCK:
        _job = thread
    thread.start()
    thread.join()
    with _JOB_LOCK:
        if _job is thread:
            _job = None
    error = outcome.get("error")
    if isinstance(error, KeyboardInterrupt) or ("value" not in outcome and error is None):
        raise CommandError(CANCELLED)
    if error is not None:
        raise error
    return outcome["value"]


def _keeping_pipelines(function, *args, **kwargs):
    """``function(*args, **kwargs)`` with the app's last loaded pipeline kept for the next run (a slider's re-run
    loads no model)."""
    from mmpos.pipelines.kept_pipelines import keep_pipelines_loaded

    with keep_pipelines_loaded(_KEPT_PIPELINES):
        return function(*args, **kwargs)


def cancel_running() -> bool:
    """Interrupt the running job (a ``KeyboardInterrupt`` raised in its thread at its next Python step, as Ctrl-C
    does on the command line); False when none runs."""
    with _JOB_LOCK:
        job = _job
        if job is None or job.finished or not job.is_alive():
            return False
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(job.ident), ctypes.py_object(KeyboardInterrupt))
        return True
