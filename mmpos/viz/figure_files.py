"""Matplotlib without a display, and figures written to a temporary name renamed into place (a crash never
leaves a half-written image under the name the user asked for)."""
from __future__ import annotations

import os
from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` (format from its suffix, PNG without one; parent folders made) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        fig.savefig(temporary, dpi=dpi, format=path.suffix.lstrip(".") or "png")
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    finally:
        pyplot().close(fig)
    os.replace(temporary, path)
    return path
