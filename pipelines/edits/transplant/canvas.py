"""PE transplant (PosBridge, arXiv 2508.17302): the canvas (the position rewrite: :mod:`.positions`).

The coordinates are the library's: canvas layouts in :mod:`mmpos.coords.canvas`, the transplanted ids in
:func:`mmpos.coords.edits.transplant_ids`; this module composes the canvas pixels and switches the ids by noise
level.

A canvas holds the background and the reference view(s) side by side on one Fill token grid. While the noise
level is high (``sigma >= tau``) the reference object's tokens get the positions of the target region (their RoPE
rows become the target's), so the inpainted region follows the reference's structure; below ``tau`` every token
has its native id again. Positions may be fractional (a reference object larger or smaller than the target
region is mapped by a similarity transform onto the target box).

What the paper's text we could read fixes: the transplant direction (target PEs onto the reference object), its
early-step window (``t >= tau``) and the FLUX.1-Fill base. Inferred and kept as parameters (spec section 3.2): the
corner-centred geometry (background centred, views in the canvas corners, margin = tile side), tile size, ``tau``,
mask dilation and the box-fit rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmpos._validation import check_choice, check_finite_fields
from mmpos.coords.canvas import CANVAS_LAYOUTS, Box, CanvasLayout
from mmpos.coords.edits import mask_bbox, transplant_ids

from ...images import dilate, mask_to_tokens, resize_image

LAYOUTS = tuple(CANVAS_LAYOUTS)
CORNERS = ("top_left", "top_right", "bottom_left", "bottom_right")


@dataclass
class TransplantConfig:
    """Hyperparameters of PE transplant. ``tau`` is a sigma threshold: transplant while ``sigma >= tau``
    (0.85 is about the first 30 % of a 28-50 step FLUX.1 schedule at 1024^2; the paper's value is unknown)."""

    layout: str = "corner_centered"
    tile_fraction: float = 0.4
    tau: float = 0.85
    apply_to: str = "object_mask"  # or "tile": every token of the reference tile
    transplant_views: str = "primary"  # or "all"
    mode: str = "transplant"  # or "swap": target tokens also take the reference's native ids
    fit: str = "contain"  # uniform scale (aspect kept) or "stretch" per axis
    round_positions: bool = False
    mask_dilate_tokens: int = 1
    object_coverage: float = 0.5  # a reference token is transplanted when the object covers more of it
    fill_value: float = 0.5
    enabled: bool = True

    def __post_init__(self):
        check_finite_fields(self)
        check_choice("layout", self.layout, LAYOUTS)
        check_choice("apply_to", self.apply_to, ("object_mask", "tile"))
        check_choice("transplant_views", self.transplant_views, ("primary", "all"))
        check_choice("mode", self.mode, ("transplant", "swap"))
        check_choice("fit", self.fit, ("contain", "stretch"))
        if not 0 < self.tile_fraction <= 1:
            raise ValueError(f"tile_fraction must be in (0, 1], got {self.tile_fraction}")
        if self.mask_dilate_tokens < 0:
            raise ValueError(f"mask_dilate_tokens must be >= 0, got {self.mask_dilate_tokens}")


def make_layout(config: TransplantConfig, height: int, width: int, num_views: int, token_pixels: int) -> CanvasLayout:
    return CANVAS_LAYOUTS[config.layout](height, width, num_views, config.tile_fraction, token_pixels)


def place_reference(reference: torch.Tensor, object_mask: torch.Tensor, tile: Box, fill_value: float):
    """Crop the reference to its object's bounding box, fit it in ``tile`` (aspect kept, centred).

    Returns the tile pixels ``[1, 3, h, w]`` and the object mask inside the tile ``[h, w]`` bool.
    """
    top, left, bottom, right = mask_bbox(object_mask)
    crop = reference[..., top:bottom, left:right]
    crop_mask = object_mask[top:bottom, left:right]
    scale = min(tile.height / crop.shape[-2], tile.width / crop.shape[-1])
    h, w = max(1, round(crop.shape[-2] * scale)), max(1, round(crop.shape[-1] * scale))
    pixels = torch.full((1, 3, tile.height, tile.width), fill_value, dtype=reference.dtype)
    mask = torch.zeros(tile.height, tile.width, dtype=torch.bool)
    y, x = (tile.height - h) // 2, (tile.width - w) // 2
    pixels[..., y : y + h, x : x + w] = resize_image(crop, (h, w))
    resized_mask = torch.nn.functional.interpolate(crop_mask[None, None].float(), size=(h, w), mode="nearest")
    mask[y : y + h, x : x + w] = resized_mask[0, 0] > 0.5
    return pixels, mask


@dataclass
class Canvas:
    image: torch.Tensor  # [1, 3, Hc, Wc] in [0, 1]
    inpaint_mask: torch.Tensor  # [Hc, Wc] bool: the (dilated) target region, the only pixels Fill repaints
    object_masks: list  # per view, [Hc, Wc] bool: the reference object on the canvas
    layout: CanvasLayout


def compose_canvas(
    config: TransplantConfig, background, target_mask, references, reference_masks, token_pixels: int
) -> Canvas:
    """Build the canvas, its inpaint mask (target mask dilated by ``mask_dilate_tokens``) and object masks."""
    height, width = background.shape[-2:]
    layout = make_layout(config, height, width, len(references), token_pixels)
    image = torch.full((1, 3, *layout.canvas_size), config.fill_value, dtype=background.dtype)
    rows, cols = layout.background.slices
    image[..., rows, cols] = background
    inpaint = torch.zeros(layout.canvas_size, dtype=torch.bool)
    inpaint[rows, cols] = dilate(target_mask, config.mask_dilate_tokens * token_pixels)
    object_masks = []
    for reference, mask, tile in zip(references, reference_masks, layout.tiles):
        pixels, tile_mask = place_reference(reference, mask, tile, config.fill_value)
        t_rows, t_cols = tile.slices
        image[..., t_rows, t_cols] = pixels
        on_canvas = torch.zeros(layout.canvas_size, dtype=torch.bool)
        on_canvas[t_rows, t_cols] = tile_mask if config.apply_to == "object_mask" else True
        object_masks.append(on_canvas)
    return Canvas(image, inpaint, object_masks, layout)


def token_sets(canvas: Canvas, config: TransplantConfig):
    """(list of source token masks, one per transplanted view; target token mask), ``[rows, cols]`` bool."""
    grid = canvas.layout.grid
    target = mask_to_tokens(canvas.inpaint_mask, grid, threshold=0.0)
    views = canvas.object_masks if config.transplant_views == "all" else canvas.object_masks[:1]
    return [mask_to_tokens(mask, grid, threshold=config.object_coverage) for mask in views], target


def canvas_ids(canvas: Canvas, config: TransplantConfig) -> torch.Tensor:
    """The canvas tokens' transplanted FLUX.1-style ids ``[rows * cols, 3]`` (``(0, row, col)``, fractional where
    moved), used while ``sigma >= tau``."""
    sources, target = token_sets(canvas, config)
    swap = config.mode == "swap"
    return transplant_ids(canvas.layout.grid, sources, target, config.fit, swap, config.round_positions)
