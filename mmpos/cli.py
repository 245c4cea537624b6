"""The ``mmpos`` console script (``mmpos.cli:main``): a thin alias of the command tree,
:mod:`mmpos.pipelines.commands` (one module per command; ``mmpos --help`` lists them)."""

from __future__ import annotations

import sys

from mmpos.pipelines.commands import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
