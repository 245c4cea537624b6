"""Matplotlib without a display, and figures written to a temporary name renamed into place (a crash never
leaves a half-written image under the name the user asked for)."""

from __future__ import annotations

from pathlib import Path

from .._atomic import written_atomically


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, dpi: int = 100, replace: bool = True) -> Path:
    """Write ``fig`` to ``path`` (format from its suffix, PNG without one; parent folders made) and close it.
    ``replace=False``: a file at ``path`` is kept and :class:`~mmpos._atomic.OutputTakenError` raised."""
    path = Path(path)
    try:
        with written_atomically(path, replace=replace) as temporary:
            fig.savefig(temporary, dpi=dpi, format=path.suffix.lstrip(".") or "png")
    finally:
        pyplot().close(fig)
    return path
