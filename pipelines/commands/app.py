"""``mmpos app``: serve the local web page (:mod:`mmpos.pipelines.app`) over the embedded mini-world models or a
user's model. Gradio is imported when the command runs (the ``[app]`` extra)."""

from __future__ import annotations

import sys

from mmpos._arguments import positive_int_arg


def register(subparsers) -> None:
    app = subparsers.add_parser(
        "app",
        help="a local web page: generate, edit, camera video, encodings (needs the [app] extra)",
        description="Serve a local web page (Gradio) with the mmpos workflows: Generate (extrapolation presets), Edit "
        "(band modulation, PE transplant, LooseRoPE), Camera video and Encodings. Each button runs the same code as "
        "its command (mmpos generate, mmpos edit, mmpos generate video, mmpos demo's figures).",
    )
    app.add_argument(
        "--model",
        default="world",
        help="from_pretrained folder or hub id of the image model the Generate and Edit tabs use, or 'world' "
        "(the embedded mini-world models, CPU)",
    )
    app.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0: every interface)")
    app.add_argument("--port", type=positive_int_arg, help="port (default: Gradio's, 7860 or the next free one)")
    app.add_argument("--outputs", help="folder the runs write into (default: a fresh temporary folder)")
    app.set_defaults(func=run)


def run(args) -> int:
    try:
        import gradio  # noqa: F401
    except ImportError:
        print(
            "mmpos app: error: the web page needs Gradio: pip install 'mmpos-toolbox[app]' (or 'gradio>=6,<7')",
            file=sys.stderr,
        )
        return 2
    from ..app import launch

    launch(args.model, args.outputs, args.host, args.port)
    return 0
