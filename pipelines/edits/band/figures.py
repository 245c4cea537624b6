"""Band modulation's diagnostic: attention of one target query over the reference per frequency band
(:class:`AttentionProbe` records q/k in one layer at one step).
"""

from __future__ import annotations

from pathlib import Path

import torch

from mmpos.integrations.diffusers.layer_rotation import LayerRotation
from mmpos.viz.figure_files import pyplot, save_figure

from ..figures import show_image


class AttentionProbe:
    """Wraps a rule on one layer: it records the rotated q and k (the reference keys band-scaled) of the first
    forward at or after ``progress`` (or of the last forward, when sampling ends before it: ``--steps 1``) and
    runs the wrapped rule unchanged on the layer call (:class:`~mmpos.pipelines.edits.families.LayerCall`)."""

    def __init__(self, rule, progress: float):
        self.rule, self.progress = rule, progress
        self.query = self.key = None
        self.reached = False

    def is_active(self, context) -> bool:
        return self.rule.is_active(context)

    def attend_call(self, call, context):
        if not self.reached:
            self._record(call.query, call.key, call.rotation, call.segments, context)
        return self.rule.attend_call(call, context)

    def _record(self, query, key, rotation: LayerRotation, seg, context) -> None:
        """q ``[B, S, H, D]`` and k before RoPE -> ``self.query`` ``[B, N, H, D]`` (the image queries, rotated)
        and ``self.key`` ``[1 | B, N', H, D]`` (the reference keys, rotated with the band-scaled table)."""
        self.reached = (context.progress or 0.0) >= self.progress
        query, key = self.rule.adain_segments(query, key, seg)  # what the rule attends with (adain_qk)
        # shared attention: queries of every image, keys of element 0; Kontext: target queries, context keys
        queries, keys = (seg.target, seg.context) if seg.context_len else (seg.image, seg.image)
        reference = key[:, keys] if seg.context_len else key[:1, keys]
        self.query = rotation(query)[:, queries].float().cpu()
        self.key = rotation(reference, self.rule.band_table(context, rotation, keys)).float().cpu()


def band_attention_maps(
    query: torch.Tensor, key: torch.Tensor, axes_dims, grid, token: int, target: int = 1, spatial_axes=(1, 2)
) -> dict:
    """Head-averaged softmax over reference tokens of one target query, from pair groups of the spatial axes:
    ``{"high": .., "mid": .., "low": .., "all": ..}`` each ``[rows, cols]``; high = first third of each axis."""
    from mmpos.spectrum import chunked_spectrum

    axis_of_pair = chunked_spectrum(axes_dims).axis_of_pair
    index_in_axis = torch.cat([torch.arange(int((axis_of_pair == a).sum())) for a in range(len(axes_dims))])
    size = torch.tensor([int((axis_of_pair == a).sum()) for a in axis_of_pair.tolist()])
    third = (3 * index_in_axis) // size  # 0 high, 1 mid, 2 low
    spatial = torch.isin(axis_of_pair, torch.tensor(list(spatial_axes)))
    groups = {
        "high": spatial & (third == 0),
        "mid": spatial & (third == 1),
        "low": spatial & (third == 2),
        "all": torch.ones_like(spatial),
    }
    q = query[target, token]  # [H, D]
    k = key[min(target, key.shape[0] - 1) if key.shape[0] > 1 else 0]  # [N, H, D]
    maps = {}
    for name, pairs in groups.items():
        channels = pairs.repeat_interleave(2)
        logits = torch.einsum("hd,nhd->hn", q[:, channels], k[:, :, channels]) / q.shape[-1] ** 0.5
        maps[name] = logits.softmax(-1).mean(0).reshape(grid)
    return maps


def band_diagnostic(maps: dict, grid, token: int, path, reference: torch.Tensor | None = None) -> Path:
    plt = pyplot()
    panels = len(maps) + (reference is not None)
    fig, axes = plt.subplots(1, panels, figsize=(2.4 * panels + 1.0, 2.6), squeeze=False, layout="constrained")
    axes = list(axes[0])
    if reference is not None:
        show_image(axes.pop(0), reference, "reference")
    row, col = divmod(token, grid[1])
    top = max(float(values.max()) for values in maps.values())  # one colour scale for every band
    for ax, (name, values) in zip(axes, maps.items()):
        image = ax.imshow(values.numpy(), cmap="magma", vmin=0.0, vmax=top)
        ax.scatter([col], [row], marker="x", c="cyan", s=20)
        ax.set_title(f"{name}-frequency pairs", fontsize=8)
        ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(f"attention of target query ({row}, {col}) over reference tokens", fontsize=9)
    return save_figure(fig, path, dpi=120)  # constrained layout (tight_layout cannot place the colour bar)
