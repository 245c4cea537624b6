"""LooseRoPE's diagnostic: token saliency, bins, loosening factor and logit factor per token."""

from __future__ import annotations

from pathlib import Path

import torch

from mmpos.viz.figure_files import pyplot

from ..figures import save_tight, show_image


def loose_diagnostic(maps, config, path, collage: torch.Tensor | None = None) -> Path:
    """Token saliency, bins and the per-token loosening / logit factors at phase 0."""
    from .rule import per_token

    plt = pyplot()
    shrink, attention = config.factors(0)
    panels = [
        ("token saliency", maps.saliency, "magma"),
        ("bin (-1: not pasted)", maps.bins.float(), "tab10"),
        ("loosening sigma", per_token(maps.bins, shrink), "viridis"),
        ("logit factor to paste", per_token(maps.bins, attention), "coolwarm"),
    ]
    fig, axes = plt.subplots(
        1, len(panels) + (collage is not None), figsize=(2.6 * (len(panels) + 1), 2.7), squeeze=False
    )
    axes = list(axes[0])
    if collage is not None:
        show_image(axes.pop(0), collage, "collage")
    for ax, (name, values, cmap) in zip(axes, panels):
        im = ax.imshow(values.float().numpy(), cmap=cmap)
        fig.colorbar(im, ax=ax, fraction=0.046)
        ax.set_title(name, fontsize=8)
        ax.axis("off")
    return save_tight(fig, path)
