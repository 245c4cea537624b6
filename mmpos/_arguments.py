"""Argument checks and ``argparse`` helpers that need no torch: the command tree parses and validates its
arguments with them before any heavy module is imported (``mmpos --help`` imports neither torch nor diffusers)."""

from __future__ import annotations

import argparse
import errno
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable


def check_choice(name: str, value, choices: Iterable) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; expected one of {choices}")


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_non_negative_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def check_even(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value % 2:
        raise ValueError(f"{name} must be a non-negative even integer (channels rotate in pairs), got {value!r}")
    return value


# ----- command lines: argparse types and a parser whose errors are one line --------------------------------------


def positive_int_arg(text: str) -> int:
    """argparse ``type=`` for counts (``--steps``, ``--count``): argparse names the option in the error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def finite_float_arg(text: str) -> float:
    """argparse ``type=`` for scales (``--guidance``): a finite number (``nan`` and ``inf`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def bounded_float_arg(low: float, high: float, closed: str = "") -> Callable[[str], float]:
    """argparse ``type=`` for a finite number in the interval from ``low`` to ``high``, open at both ends unless
    ``closed`` says ``"low"``, ``"high"`` or ``"both"`` (``--fov``: (0, 180); ``--scale``: (0, 100])."""
    low_in, high_in = closed in ("low", "both"), closed in ("high", "both")
    interval = f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"

    def parse(text: str) -> float:
        value = finite_float_arg(text)
        if not ((low <= value if low_in else low < value) and (value <= high if high_in else value < high)):
            raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {text!r}")
        return value

    parse.__name__ = f"number in {interval}"  # argparse names the type in some messages
    return parse


def bounded_int_arg(low: int, high: int) -> Callable[[str], int]:
    """argparse ``type=`` for an integer in ``[low, high]`` (``--objects``: [0, 64])."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {text!r}")
        return value

    parse.__name__ = f"integer in [{low}, {high}]"
    return parse


def check_out_writable(out, option: str = "--out") -> None:
    """A ValueError naming ``option`` unless files can be created at ``out`` (a folder or file, made or not): the
    nearest part of it that exists must be a folder this process can create a file in. Tried with a real file,
    removed at once (permission bits say nothing for root, nor for ``/proc`` or a read-only mount)."""
    out = Path(out)
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if existing != out and not existing.is_dir():
        raise ValueError(f"{option} {out} cannot be created: {existing} is a file; expected a folder")
    folder = existing if existing.is_dir() else existing.parent
    try:
        descriptor, probe = tempfile.mkstemp(prefix=".mmpos-write-check-", dir=folder)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ValueError(f"{option} {out}: cannot write in {folder} ({reason}); expected a writable folder") from None
    os.close(descriptor)
    os.unlink(probe)


WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO}


def write_error_line(error: OSError) -> str | None:
    """The one line for an ``OSError`` a command met writing its outputs (disk full, quota, read-only, no
    permission), naming the file; None for other errors (a bug: a traceback is more useful)."""
    if error.errno not in WRITE_ERRORS:
        return None
    where = f" {error.filename}" if error.filename else ""
    return f"cannot write{where}: {error.strerror or os.strerror(error.errno)}; free space or choose another --out"


def user_error(prog: str, message) -> SystemExit:
    """``raise user_error(PROG, error)``: ``PROG: error: message`` on stderr, one line, and exit code 2 (a user
    error, as argparse reports its own; ``SystemExit("text")`` would exit 1)."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return SystemExit(2)


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (``prog: error: ...``, exit code 2), without the usage
    block; its subparsers are of the same class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with ``(default: X)`` after each option whose help does not state its default already (options
    without a default to show, None, False or empty, are left as written)."""

    def _get_help_string(self, action):
        text = action.help or ""
        hidden = any(action.default is value for value in (None, False, argparse.SUPPRESS)) or action.default == []
        if "default" in text or hidden or not action.option_strings:
            return text
        return super()._get_help_string(action)


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every subcommand parser under it :class:`DefaultsHelpFormatter`."""
    parser.formatter_class = DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                show_defaults(subparser)
