"""``mmpos app``: a local web page (Gradio) over the ``mmpos`` commands: generate with extrapolation, the three PE
edits, camera-controlled world video, encoding figures. Needs the ``[app]`` extra (``pip install
'mmpos-toolbox[app]'``); :mod:`.workflows` and :mod:`.runs` run without it."""

from __future__ import annotations

from pathlib import Path


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
