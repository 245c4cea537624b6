"""``mmpos app``: a local web page (Gradio, the ``[app]`` extra) over the ``mmpos`` commands: generate with
extrapolation, the three PE edits, camera-controlled world video, encoding figures. Every button runs a command of
this tree in-process (:mod:`.runs`; what each button runs: :mod:`.workflows`, Gradio-free; the page: :mod:`.page`).
Parsing stays light: Gradio, torch and diffusers are imported when the command runs."""

from __future__ import annotations

import sys
from pathlib import Path

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
    launch(args.model, args.outputs, args.host, args.port)
    return 0


def launch(
    model: str = "world",
    outputs: Path | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    **launch_options,
):
    """Build the page over ``model`` (runs written under ``outputs``, default a fresh temporary folder) and serve it."""
    import tempfile

    from .page import PAGE_CSS, build_app
    from .workflows import Workspace

    root = Path(outputs) if outputs is not None else Path(tempfile.mkdtemp(prefix="mmpos-app-"))
    root.mkdir(parents=True, exist_ok=True)
    app = build_app(Workspace(root.resolve(), model))
    app.queue()
    return app.launch(
        server_name=host, server_port=port, allowed_paths=[str(root.resolve())], css=PAGE_CSS, **launch_options
    )
