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
import sys

from mmpos._arguments import OneLineErrorParser, show_defaults
from mmpos.training.interrupt import EXIT_CODE

from . import app, bench, demo, edit, evaluate, generate, listing, train, viz, world
from ._options import split_comma_box

COMMANDS = [  # one line per command, in the order `mmpos --help` lists them
    demo,
    listing,
    bench,
    viz,
    edit,
    generate,
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
    stops at its next update on its own (:mod:`mmpos.training.interrupt`)."""
    argv = split_comma_box(sys.argv[1:] if argv is None else list(argv))
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"mmpos {args.command}: interrupted", file=sys.stderr)
        return EXIT_CODE
