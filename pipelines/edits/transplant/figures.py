"""PE transplant's diagnostic: the canvas, the inpaint region and the row / column ids of every token."""

from __future__ import annotations

from pathlib import Path

import torch

from mmpos.viz.figure_files import pyplot

from ..figures import save_tight, show_image


def transplant_diagnostic(canvas, ids: torch.Tensor, native: torch.Tensor, path, image_axes=(1, 2)) -> Path:
    """Canvas with the inpaint region, then the row and column id of every token while transplanting (``ids``,
    ``native``: ``[N, A]`` in the family's coordinates; ``image_axes``: its row and column axes)."""
    plt = pyplot()
    grid = canvas.layout.grid
    fig, axes = plt.subplots(1, 3, figsize=(8, 2.8))
    show_image(axes[0], canvas.image[0], "canvas (red: inpaint, cyan: object)")
    axes[0].contour(canvas.inpaint_mask.float().numpy(), levels=[0.5], colors="red", linewidths=1)
    for mask in canvas.object_masks:
        axes[0].contour(mask.float().numpy(), levels=[0.5], colors="cyan", linewidths=1)
    moved = (ids != native).any(1).reshape(grid)
    for ax, axis, name in ((axes[1], image_axes[0], "row"), (axes[2], image_axes[1], "column")):
        im = ax.imshow(ids[:, axis].reshape(grid).numpy(), cmap="viridis")
        ys, xs = torch.nonzero(moved, as_tuple=True)
        ax.scatter(xs.numpy(), ys.numpy(), marker=".", c="red", s=8)
        ax.set_title(f"{name} id (red dots: transplanted)", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046)
        ax.axis("off")
    return save_tight(fig, path)
