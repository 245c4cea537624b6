"""Canvas layouts: where a background and reference tiles sit on one token grid (PE transplant's canvas).

Pixel geometry snapped to whole tokens (``token_pixels`` per side); the ids of the canvas are
:func:`~mmpos.coords.grids.flux_ids` of :attr:`CanvasLayout.grid`, rewritten by
:func:`~mmpos.coords.edits.transplant_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Box:
    """Pixel rectangle ``[top, top + height) x [left, left + width)``."""

    top: int
    left: int
    height: int
    width: int

    @property
    def slices(self) -> tuple[slice, slice]:
        return slice(self.top, self.top + self.height), slice(self.left, self.left + self.width)


@dataclass
class CanvasLayout:
    """Where the background and each reference tile sit on the canvas (pixels, on the token grid)."""

    canvas_size: tuple[int, int]
    background: Box
    tiles: list = field(default_factory=list)
    token_pixels: int = 16

    @property
    def grid(self) -> tuple[int, int]:
        return self.canvas_size[0] // self.token_pixels, self.canvas_size[1] // self.token_pixels


def _snap(pixels: float, token_pixels: int) -> int:
    return max(token_pixels, int(round(pixels / token_pixels)) * token_pixels)


def corner_centered_layout(
    height: int, width: int, num_views: int = 1, tile_fraction: float = 0.4, token_pixels: int = 16
) -> CanvasLayout:
    """Background centred in a frame one tile wide; views in the corners (TL, TR, BL, BR), at most 4."""
    if not 1 <= num_views <= 4:
        raise ValueError(f"the corner-centred layout holds 1 to 4 reference views, got {num_views}")
    tile = _snap(tile_fraction * min(height, width), token_pixels)
    canvas = (height + 2 * tile, width + 2 * tile)
    corners = [
        Box(0, 0, tile, tile),
        Box(0, canvas[1] - tile, tile, tile),
        Box(canvas[0] - tile, 0, tile, tile),
        Box(canvas[0] - tile, canvas[1] - tile, tile, tile),
    ]
    return CanvasLayout(canvas, Box(tile, tile, height, width), corners[:num_views], token_pixels)


def side_by_side_layout(
    height: int, width: int, num_views: int = 1, tile_fraction: float = 1.0, token_pixels: int = 16
) -> CanvasLayout:
    """Reference views stacked in a column left of the background (tile side ``height / num_views``);
    ``tile_fraction`` is accepted for a common signature with :func:`corner_centered_layout` and unused."""
    if num_views < 1:
        raise ValueError(f"num_views must be >= 1, got {num_views}")
    tile = _snap(height / num_views, token_pixels)
    if tile * num_views > height:
        tile -= token_pixels
    if tile < token_pixels:
        raise ValueError(f"{num_views} views do not fit beside a background {height} pixels high")
    tiles = [Box(i * tile, 0, tile, tile) for i in range(num_views)]
    return CanvasLayout((height, width + tile), Box(0, tile, height, width), tiles, token_pixels)


CANVAS_LAYOUTS = {"corner_centered": corner_centered_layout, "side_by_side": side_by_side_layout}
