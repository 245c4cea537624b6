"""Coordinate edits: pure functions that rewrite some tokens' Flux ids ``[L, 3]`` = ``(index, row, col)``.

PE transplant (PosBridge) moves a reference object's tokens onto the target region (:func:`transplant_ids`);
LooseRoPE shrinks the spatial coordinates toward a centre (:func:`shrink_ids`). Both return new fp32 tensors;
inputs are never modified.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .grids import flux_ids


def mask_bbox(mask: torch.Tensor) -> tuple[int, int, int, int]:
    """``(top, left, bottom, right)`` of the selected cells of a 2-D bool ``mask`` (bottom/right exclusive)."""
    if mask.dim() != 2 or not bool(mask.any()):
        raise ValueError(
            f"mask must be a 2-D bool tensor with at least one selected cell, got shape "
            f"{tuple(mask.shape)} with {int(mask.sum()) if mask.numel() else 0} selected"
        )
    rows = torch.nonzero(mask.any(1)).flatten()
    cols = torch.nonzero(mask.any(0)).flatten()
    return int(rows[0]), int(cols[0]), int(rows[-1]) + 1, int(cols[-1]) + 1


Box4 = tuple[float, float, float, float]  # (top, left, bottom, right) in tokens, exclusive ends


def box_map(source: Box4, target: Box4, fit: str = "contain") -> tuple[tuple[float, float], ...]:
    """Per-axis ``(scale, offset)`` sending token centres of the ``source`` box onto the ``target`` box.

    Boxes are ``(top, left, bottom, right)`` in tokens (exclusive ends); a token at index ``i`` has centre
    ``i + 0.5``, so equal-sized boxes map integer ids to integer ids. ``fit="contain"`` keeps the aspect (one
    scale for both axes, the smaller), ``"stretch"`` scales each axis on its own.
    """
    if fit not in ("contain", "stretch"):
        raise ValueError(f"fit={fit!r} is not supported; expected one of ('contain', 'stretch')")
    sh, sw = source[2] - source[0], source[3] - source[1]
    th, tw = target[2] - target[0], target[3] - target[1]
    scale = (th / sh, tw / sw)
    if fit == "contain":
        scale = (min(scale),) * 2
    centre_s = ((source[0] + source[2]) / 2, (source[1] + source[3]) / 2)
    centre_t = ((target[0] + target[2]) / 2, (target[1] + target[3]) / 2)
    return tuple((s, ct - s * cs) for s, cs, ct in zip(scale, centre_s, centre_t))


def transplant_ids(
    grid: tuple[int, int],
    sources: torch.Tensor | Sequence[torch.Tensor],
    target_tokens: torch.Tensor,
    fit: str = "contain",
    swap: bool = False,
    round_positions: bool = False,
) -> torch.Tensor:
    """Canvas ids ``[rows * cols, 3]`` float32 with each source token set moved onto the target box.

    ``sources`` is one ``[rows, cols]`` bool mask or a list (one per reference view, each mapped by its own
    bounding box); ``target_tokens`` is ``[rows, cols]`` bool. A source token at ``(r, c)`` gets
    ``(0, a_r (r + 0.5) + b_r - 0.5, a_c (c + 0.5) + b_c - 0.5)``, the similarity transform between the two
    bounding boxes; with ``swap`` the target tokens get the inverse map of the first source (onto its box).
    """
    sources = [sources] if isinstance(sources, torch.Tensor) else list(sources)
    if not sources or any(not bool(s.any()) for s in sources):
        raise ValueError(
            "a reference object covers no token (more than object_coverage of one); enlarge the "
            "object mask or tile_fraction, or lower object_coverage"
        )
    if not bool(target_tokens.any()):
        raise ValueError("the target region covers no token; enlarge the target mask")
    ids = flux_ids(*grid)
    target_bounds = mask_bbox(target_tokens)
    maps = [box_map(mask_bbox(source), target_bounds, fit) for source in sources]
    moved = list(zip(sources, maps))
    if swap:
        moved.append((target_tokens, tuple((1 / a, -b / a) for a, b in maps[0])))
    result = ids.clone()
    for tokens, ((a_r, b_r), (a_c, b_c)) in moved:
        index = tokens.flatten().nonzero().flatten()
        rows, cols = ids[index, 1].double(), ids[index, 2].double()
        result[index, 1] = (a_r * (rows + 0.5) + b_r - 0.5).float()
        result[index, 2] = (a_c * (cols + 0.5) + b_c - 0.5).float()
    if round_positions:
        result = result.round()
    return result


def shrink_ids(
    img_ids: torch.Tensor,
    factor: float,
    centre: tuple[float, float],
    bf16: bool = False,
    axes: tuple[int, int] = (1, 2),
) -> torch.Tensor:
    """Spatial ``axes`` (default 1, 2: rows, cols) of ``img_ids`` ``[L, A]`` moved toward ``centre`` by
    ``factor``; the other axes kept (FLUX.1's axis 0: target 0 / context 1; FLUX.2's ``t`` and ``l``). fp32
    (``bf16=True`` rounds the result through bf16, as some peers' ids are)."""
    ids = img_ids.float().clone()
    centre_t = torch.tensor(centre, dtype=torch.float32, device=ids.device)
    spatial = list(axes)
    ids[:, spatial] = centre_t + factor * (ids[:, spatial] - centre_t)
    return ids.to(torch.bfloat16).float() if bf16 else ids
