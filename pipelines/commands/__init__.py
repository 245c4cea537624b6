"""The ``mmpos`` command tree, in the style of diffusers' ``commands/``: one module per top-level command, each
(named by its command; ``listing`` and ``evaluate`` for ``list`` and ``eval``, builtins' names) with
``register(subparsers)`` (its parser, options and sub-commands, ``set_defaults(func=run)``) and
``run(args) -> int``; :func:`build_parser` builds the one root parser from :data:`COMMANDS`.

Parsing is light: command modules import torch, diffusers and timm only inside ``run``, so ``mmpos --help``,
every ``mmpos COMMAND --help`` and every argument error (one line, exit code 2) come before any heavy import.
Adding a command: a module here with ``register`` and ``run``, and one line in :data:`COMMANDS`
(docs/adding_a_command.md).
"""

from __future__ import annotations

import argparse
import os
import sys

from mmpos._arguments import OneLineErrorParser, check_out_writable, show_defaults, user_error, write_error_line
from mmpos._atomic import ConcurrentWriteError, claim_output, claimed_outputs
from mmpos.training.scaffold.interrupt import EXIT_CODE

from . import app, bench, demo, edit, evaluate, generate, listing, tiny_pipeline, train, viz, world

COMMANDS = [  # one line per command, in the order `mmpos --help` lists them
    demo,
    listing,
    bench,
    viz,
    edit,
    generate,
    tiny_pipeline,
    world,
    train,
    evaluate,
    app,
]


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The root ``mmpos`` parser with every module of ``commands`` (default: :data:`COMMANDS`) registered."""
    parser = OneLineErrorParser(
        prog="mmpos", description="Positional encodings for vision and multimodal transformers and diffusion models."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS if commands is None else commands:
        command.register(subparsers)
    show_defaults(parser)
    return parser


def command_paths(parser: argparse.ArgumentParser, path: tuple = ()):
    """Every command word path under ``parser``: ``()`` (``mmpos`` itself), ``("demo",)``, ...,
    ``("generate", "video")``."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from command_paths(sub, (*path, name))


def main(argv=None) -> int:
    """``mmpos ARGS``: parse (light), then run the chosen command (heavy imports happen there). Ctrl-C
    (``KeyboardInterrupt``) while a command loads or runs ends it with one line and exit code 130; a training loop
    stops at its next update on its own (:mod:`mmpos.training.scaffold.interrupt`). A named ``--out`` is claimed
    for the whole run: a second ``mmpos`` writing it meanwhile stops at once with one line (exit code 2)."""
    return run_parsed(build_parser().parse_args(sys.argv[1:] if argv is None else list(argv)))


def run_parsed(args, call=None) -> int:
    """Run the parsed command as :func:`main` does (``--out`` checked and claimed, Ctrl-C and write errors as one
    line): ``call(args)``, by default the command's own ``run`` (``mmpos app`` runs commands this way)."""
    try:
        check_outputs_writable(args)  # before the claim: its lock file goes beside --out
    except ValueError as error:
        raise user_error(f"mmpos {args.command}", error) from None
    try:
        with claimed_outputs():
            if getattr(args, "out", None) and os.environ.get("RANK", "0") == "0":  # one claim per launch
                try:
                    claim_output(args.out)
                except ConcurrentWriteError as error:
                    print(f"mmpos {args.command}: error: --out {error}", file=sys.stderr)
                    raise SystemExit(2) from None
            return (call or args.func)(args)
    except KeyboardInterrupt:
        print(f"mmpos {args.command}: interrupted", file=sys.stderr)
        return EXIT_CODE
    except OSError as error:  # disk full, quota, read-only file system while writing: one line naming the file
        line = write_error_line(error)
        if line is None:
            raise
        raise user_error(f"mmpos {args.command}", line) from None


def check_outputs_writable(args) -> None:
    """``--out`` / ``--output-dir`` of the chosen command: files can be created there, checked before any work."""
    for dest, option in (("out", "--out"), ("output_dir", "--output-dir")):
        value = getattr(args, dest, None)
        if isinstance(value, str) and value:
            check_out_writable(value, option)
