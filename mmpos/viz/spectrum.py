"""Figures of an encoding: its spectrum (frequency per channel pair and axis) and its attention-logit
pattern against the offset between two tokens on a 2D grid."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from ..coords.grids import image_grid
from ..encodings.absolute import AbsolutePE, LearnedAPE, SinCosAPE
from ..encodings.rotary_base import RotaryPE

AXIS_NAMES = ("axis 0", "axis 1", "axis 2", "axis 3")


def frequency_matrix(pe) -> torch.Tensor | None:
    """``[A, P]`` or ``[H, A, P]`` radians per coordinate unit, or ``None`` when there is no spectrum."""
    if isinstance(pe, RotaryPE):
        return pe.frequency_matrix()
    if isinstance(pe, SinCosAPE):
        half = pe.embed_dim // pe.num_axes // 2
        ladder = 1.0 / pe.theta ** (torch.arange(half, dtype=torch.float64) / half)
        matrix = torch.zeros(pe.num_axes, pe.num_axes * half, dtype=torch.float64)
        for axis in range(pe.num_axes):
            matrix[axis, axis * half : (axis + 1) * half] = ladder
        return matrix
    return None


def grid_coords_for(pe, height: int, width: int) -> torch.Tensor:
    """2D grid coordinates in the encoding's own axes: raster index (1 axis), (row, col), or (0, row, col)."""
    if hasattr(pe, "image_coords"):  # encodings with their own image layout (VRoPE's diagonal ids)
        return pe.image_coords(height, width)
    grid = image_grid(height, width, dtype=torch.float64)
    num_axes = getattr(pe, "num_axes", 2)
    if num_axes == 1:
        return (grid[:, 0] * width + grid[:, 1])[:, None]
    if num_axes == 2:
        return grid
    return torch.cat([torch.zeros(grid.shape[0], num_axes - 2, dtype=torch.float64), grid], dim=-1)


@torch.no_grad()
def logit_map(pe, size: int = 31) -> torch.Tensor:
    """``[size, size]`` logit between a query at the grid centre and a key at each cell.

    Rotary: q = k = the all-ones vector, so the map is ``sum_p cos(phase offset)`` averaged over heads (head-wise
    encodings such as MHRoPE give each head other axes), the pattern the encoding imposes on content-free
    attention. Absolute: ``e(centre) . e(cell)``. NoPE: constant.
    """
    coords = grid_coords_for(pe, size, size)
    centre = (size // 2) * size + size // 2
    if isinstance(pe, RotaryPE):
        head_dim = pe.head_dim
        heads = getattr(pe, "num_heads", 1)
        ones = torch.ones(1, heads, size * size + pe.num_prefix_tokens, head_dim, dtype=torch.float64)
        q, k = pe(ones, ones, coords)  # fp64 inputs: fp64 tables and arithmetic
        n = pe.num_prefix_tokens
        per_head = torch.einsum("hld,hd->hl", k[0, :, n:], q[0, :, n + centre]) / head_dim
        return per_head.mean(0).reshape(size, size)
    if isinstance(pe, AbsolutePE):
        if isinstance(pe, LearnedAPE):
            emb = pe.resample((size, size)).double()
        else:
            emb = pe.embed(coords).double()
        emb = emb / emb.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return (emb @ emb[centre]).reshape(size, size)
    return torch.ones(size, size, dtype=torch.float64)


def plot_spectrum(ax, pe, title: str = "") -> None:
    matrix = frequency_matrix(pe)
    ax.set_title(title or "spectrum")
    if matrix is None:
        ax.text(
            0.5, 0.5, "no frequency spectrum\n(learned table or none)", ha="center", va="center", transform=ax.transAxes
        )
        ax.set_xticks([]), ax.set_yticks([])
        return
    if matrix.dim() == 3:  # per-head: show head 0 (solid) and head 1 (dashed)
        heads = [(0, "-"), (1, "--")][: matrix.shape[0]]
    else:
        matrix, heads = matrix[None], [(0, "-")]
    pairs = torch.arange(matrix.shape[-1])
    for head, style in heads:
        for axis in range(matrix.shape[1]):
            freq = matrix[head, axis].abs()
            mask = freq > 0
            label = f"{AXIS_NAMES[axis]}" + (f" head {head}" if len(heads) > 1 else "")
            ax.plot(pairs[mask], freq[mask], style, marker=".", ms=3, label=label, color=f"C{axis}")
    ax.set_yscale("log")
    ax.set_xlabel("channel pair")
    ax.set_ylabel("|frequency| (rad / unit)")
    ax.legend(fontsize=7)


def plot_logit_map(ax, pe, size: int = 31, title: str = "") -> None:
    values = logit_map(pe, size)
    half = size // 2
    im = ax.imshow(values.numpy(), cmap="RdBu_r", extent=(-half - 0.5, half + 0.5, half + 0.5, -half - 0.5))
    ax.set_title(title or "logit vs offset")
    ax.set_xlabel("column offset")
    ax.set_ylabel("row offset")
    ax.figure.colorbar(im, ax=ax, fraction=0.046)


def figure_settings(pe) -> str:
    """What an encoding figure shows, in one line: head size and heads, the grid coordinates the encoding reads,
    and whether its parameters are learned (shown at initialisation)."""
    parts = []
    if isinstance(pe, RotaryPE):
        heads = getattr(pe, "num_heads", 1)
        parts.append(f"head_dim {pe.head_dim}" + (f", mean over {heads} heads" if heads > 1 else ""))
    if hasattr(pe, "image_coords"):
        parts.append("the encoding's own image ids (image_coords)")
    elif isinstance(pe, (RotaryPE, AbsolutePE)):
        axes = getattr(pe, "num_axes", 2)
        parts.append(
            {
                1: "positions in raster order (row * W + col)",
                2: "coordinates (row, col)",
                3: "coordinates (t = 0, row, col)",
            }.get(axes, f"coordinates (0, ..., 0, row, col), {axes} axes")
        )
    if any(p.requires_grad for p in pe.parameters()):
        parts.append("learned parameters at initialisation (seed 0), not trained")
    return "; ".join(parts)


def encoding_figure(pe, name: str, path: Path, size: int = 31, note: str = "") -> Path:
    """Save a two-panel figure (spectrum, logit-vs-offset map) of ``pe`` to ``path``, its settings (and
    ``note``) above the panels (:func:`figure_settings`)."""
    from .figure_files import pyplot, save_figure

    fig, (left, right) = pyplot().subplots(1, 2, figsize=(10, 4.3))
    plot_spectrum(left, pe, f"{name}: spectrum")
    plot_logit_map(right, pe, size, f"{name}: content-free logit vs 2D offset")
    fig.suptitle(textwrap.fill(figure_settings(pe) + (f". {note}" if note else ""), 130), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
