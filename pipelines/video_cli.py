"""Deprecated (one release): ``mmpos generate video`` moved; its options are in
:mod:`mmpos.pipelines.commands.generate`, its run in :mod:`mmpos.pipelines.commands.generate.video`. The names below still
import from here, with a ``DeprecationWarning``."""

from __future__ import annotations

import sys
import warnings

from mmpos._deprecation import moved_names

_RUN = "mmpos.pipelines.commands.generate.video"
__getattr__ = moved_names(
    __name__,
    {
        "build_parser": "mmpos.pipelines.commands.generate:video_parser",
        **dict.fromkeys(
            (
                "TINY",
                "OUTPUT_NAMES",
                "SPATIAL",
                "PATCH_PIXELS",
                "riflex_k",
                "extrapolation_policies",
                "_frame_count",
                "_train_size",
                "_settings",
                "_given",
                "_outputs",
            ),
            _RUN,
        ),
    },
)


def run(argv=None) -> int:
    """``mmpos generate video ARGS`` (deprecated: ``mmpos.pipelines.commands.main(["generate", "video", ...])``)."""
    warnings.warn(
        "mmpos.pipelines.video_cli.run moved: call mmpos.pipelines.commands.main(['generate', 'video', "
        "...]); the old path goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    from .commands.generate import video_parser
    from .commands.generate.video import run_video

    parser = video_parser()
    return run_video(parser.parse_args(argv), parser)


main = run

if __name__ == "__main__":
    from .commands import main

    sys.exit(main(["generate", "video", *sys.argv[1:]]))
