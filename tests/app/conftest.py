"""The ``mmpos app`` page served once per test session on the embedded world models (CPU), with input pictures
drawn here. Skipped, saying why, where Gradio or gradio_client is not installed (``make test-app`` installs them)."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch
from PIL import Image

gradio = pytest.importorskip("gradio", reason="mmpos app needs the [app] extra: make test-app (pip install gradio)")
pytest.importorskip("gradio_client", reason="the API tests need gradio_client: make test-app")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def served_app(tmp_path_factory):
    """``(url, outputs folder)`` of the page, served in this process (one thread per torch op: tiny models)."""
    from mmpos.pipelines.commands.app.page import PAGE_CSS, build_app
    from mmpos.pipelines.commands.app.workflows import Workspace

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("app-runs")
    app = build_app(Workspace(root, "world"))
    app.queue()
    port = _free_port()
    app.launch(
        server_name="127.0.0.1",
        server_port=port,
        prevent_thread_lock=True,
        allowed_paths=[str(root)],
        quiet=True,
        css=PAGE_CSS,
    )
    yield f"http://127.0.0.1:{port}/", root
    app.close()
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def pictures(tmp_path_factory) -> dict:
    """Input files a user would upload: a 48 x 40 background (not square, so it is fitted into the model's 32 px),
    an object (a red square on white), a collage (the object pasted on the background) and the background before."""
    folder = tmp_path_factory.mktemp("pictures")
    background = np.full((40, 48, 3), 255, np.uint8)
    background[::4] = (250, 200, 60)  # a striped yellow background
    obj = np.full((32, 32, 3), 255, np.uint8)
    obj[8:24, 8:24] = (220, 30, 30)
    collage = background.copy()
    collage[12:28, 16:32] = (220, 30, 30)
    paths = {}
    for name, array in dict(background=background, object=obj, collage=collage).items():
        paths[name] = folder / f"{name}.png"
        Image.fromarray(array).save(paths[name])
    return paths
