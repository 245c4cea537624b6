"""The comparison strip every edit method writes (inputs, edited, a strength sweep), and the two helpers the
methods' own diagnostics (``edits/<method>/figures.py``) draw with."""

from __future__ import annotations

from pathlib import Path

import torch

from mmpos.viz.figure_files import pyplot, save_figure


def show_image(ax, image: torch.Tensor, title: str):
    """``image [3, H, W]`` in [0, 1] on ``ax``, titled, without axes."""
    ax.imshow(image.detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy())
    ax.set_title(title, fontsize=8)
    ax.axis("off")


def comparison_figure(
    inputs: dict, edited: dict, sweep: dict, path, title: str = "", overlays: dict | None = None
) -> Path:
    """One row: named input images, named edited images, then the sweep (label -> image), all ``[3, H, W]``.
    ``overlays``: input name -> ``[(mask [H, W] bool, colour, label), ...]`` outlined on that input's panel."""
    plt = pyplot()
    panels = [(f"input: {k}", v, (overlays or {}).get(k, [])) for k, v in inputs.items()]
    panels += [(f"edited: {k}", v, []) for k, v in edited.items()] + [(f"sweep {k}", v, []) for k, v in sweep.items()]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.2 * len(panels), 2.6), squeeze=False)
    for ax, (label, image, outlines) in zip(axes[0], panels):
        names = [f"{name} ({colour})" for _, colour, name in outlines]
        show_image(ax, image, label + ("\n" + ", ".join(names) if names else ""))
        for mask, colour, _ in outlines:
            ax.contour(mask.float().numpy(), levels=[0.5], colors=colour, linewidths=1)
    fig.suptitle(title, fontsize=9)
    return save_tight(fig, path)


def save_tight(fig, path) -> Path:
    """``fig`` laid out tight and written to ``path`` (atomically, 120 dpi)."""
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)
