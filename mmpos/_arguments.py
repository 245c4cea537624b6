"""Argument checks and ``argparse`` helpers that need no torch: the command tree parses and validates its
arguments with them before any heavy module is imported (``mmpos --help`` imports neither torch nor diffusers)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Iterable


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
