"""Deprecated (one release): ``mmpos edit`` and ``mmpos generate`` moved to :mod:`mmpos.pipelines.commands`
(``.edit``, ``.generate``); the names below still import from here, with a ``DeprecationWarning``."""

from __future__ import annotations

import sys
import warnings

from mmpos._deprecation import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "main": "mmpos.pipelines.commands",
        "METHODS": "mmpos.pipelines.commands.edit",
        "run_edit": "mmpos.pipelines.commands.edit:run",
        "split_comma_box": "mmpos.pipelines.commands._options",
        "report_written": "mmpos.pipelines.commands._options",
        "run_generate": "mmpos.pipelines.commands.generate.image",
    },
)


def add_commands(subparsers) -> None:
    """Register ``edit`` and ``generate`` on ``subparsers`` (deprecated: their modules' ``register``)."""
    warnings.warn(
        "mmpos.pipelines.cli.add_commands moved: mmpos.pipelines.commands.edit.register and "
        ".generate.register; the old path goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    from .commands import edit, generate

    edit.register(subparsers)
    generate.register(subparsers)


if __name__ == "__main__":
    from .commands import main

    sys.exit(main())
