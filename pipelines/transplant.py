"""PE transplant (PosBridge, arXiv 2508.17302): canvas layouts and transplanted Flux ids.

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

from dataclasses import dataclass, field

import torch

from mmpos._validation import check_choice

from .images import dilate, mask_bbox, mask_to_tokens, resize_image

LAYOUTS = ("corner_centered", "side_by_side")
CORNERS = ("top_left", "top_right", "bottom_left", "bottom_right")


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
class TransplantConfig:
    """Hyperparameters of PE transplant. ``tau`` is a sigma threshold: transplant while ``sigma >= tau``
    (0.85 is about the first 30 % of a 28-50 step FLUX.1 schedule at 1024^2; the paper's value is unknown)."""

    layout: str = "corner_centered"
    tile_fraction: float = 0.4
    tau: float = 0.85
    apply_to: str = "object_mask"         # or "tile": every token of the reference tile
    transplant_views: str = "primary"     # or "all"
    mode: str = "transplant"              # or "swap": target tokens also take the reference's native ids
    fit: str = "contain"                  # uniform scale (aspect kept) or "stretch" per axis
    round_positions: bool = False
    mask_dilate_tokens: int = 1
    object_coverage: float = 0.5          # a reference token is transplanted when the object covers more of it
    fill_value: float = 0.5
    enabled: bool = True

    def __post_init__(self):
        check_choice("layout", self.layout, LAYOUTS)
        check_choice("apply_to", self.apply_to, ("object_mask", "tile"))
        check_choice("transplant_views", self.transplant_views, ("primary", "all"))
        check_choice("mode", self.mode, ("transplant", "swap"))
        check_choice("fit", self.fit, ("contain", "stretch"))
        if not 0 < self.tile_fraction <= 1:
            raise ValueError(f"tile_fraction must be in (0, 1], got {self.tile_fraction}")
        if self.mask_dilate_tokens < 0:
            raise ValueError(f"mask_dilate_tokens must be >= 0, got {self.mask_dilate_tokens}")


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


def corner_centered_layout(height: int, width: int, num_views: int = 1, tile_fraction: float = 0.4,
                           token_pixels: int = 16) -> CanvasLayout:
    """Background centred in a frame one tile wide; views in the corners (TL, TR, BL, BR), at most 4."""
    if not 1 <= num_views <= 4:
        raise ValueError(f"the corner-centred layout holds 1 to 4 reference views, got {num_views}")
    tile = _snap(tile_fraction * min(height, width), token_pixels)
    canvas = (height + 2 * tile, width + 2 * tile)
    corners = [Box(0, 0, tile, tile), Box(0, canvas[1] - tile, tile, tile),
               Box(canvas[0] - tile, 0, tile, tile), Box(canvas[0] - tile, canvas[1] - tile, tile, tile)]
    return CanvasLayout(canvas, Box(tile, tile, height, width), corners[:num_views], token_pixels)


def side_by_side_layout(height: int, width: int, num_views: int = 1, tile_fraction: float = 1.0,
                        token_pixels: int = 16) -> CanvasLayout:
    """Reference views stacked in a column left of the background (tile side ``height / num_views``)."""
    if num_views < 1:
        raise ValueError(f"num_views must be >= 1, got {num_views}")
    tile = _snap(height / num_views, token_pixels)
    if tile * num_views > height:
        tile -= token_pixels
    if tile < token_pixels:
        raise ValueError(f"{num_views} views do not fit beside a background {height} pixels high")
    tiles = [Box(i * tile, 0, tile, tile) for i in range(num_views)]
    return CanvasLayout((height, width + tile), Box(0, tile, height, width), tiles, token_pixels)


def make_layout(config: TransplantConfig, height: int, width: int, num_views: int, token_pixels: int):
    build = corner_centered_layout if config.layout == "corner_centered" else side_by_side_layout
    return build(height, width, num_views, config.tile_fraction, token_pixels)


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
    pixels[..., y:y + h, x:x + w] = resize_image(crop, (h, w))
    resized_mask = torch.nn.functional.interpolate(crop_mask[None, None].float(), size=(h, w), mode="nearest")
    mask[y:y + h, x:x + w] = resized_mask[0, 0] > 0.5
    return pixels, mask


@dataclass
class Canvas:
    image: torch.Tensor          # [1, 3, Hc, Wc] in [0, 1]
    inpaint_mask: torch.Tensor   # [Hc, Wc] bool: the (dilated) target region, the only pixels Fill repaints
    object_masks: list           # per view, [Hc, Wc] bool: the reference object on the canvas
    layout: CanvasLayout


def compose_canvas(config: TransplantConfig, background, target_mask, references, reference_masks,
                   token_pixels: int) -> Canvas:
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


def native_ids(grid: tuple[int, int], dtype=torch.float32, device=None) -> torch.Tensor:
    """``[rows * cols, 3]`` ids ``(0, row, col)``, row-major, as ``FluxPipeline._prepare_latent_image_ids``."""
    rows = torch.arange(grid[0], dtype=dtype, device=device)
    cols = torch.arange(grid[1], dtype=dtype, device=device)
    mesh = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).reshape(-1, 2)
    return torch.cat([torch.zeros_like(mesh[:, :1]), mesh], dim=-1)


def _box_map(source: tuple, target: tuple, fit: str):
    """Per-axis (scale, offset) sending token centres of the ``source`` box onto the ``target`` box.

    Boxes are ``(top, left, bottom, right)`` in tokens (exclusive ends); a token at index ``i`` has centre
    ``i + 0.5``, so equal-sized boxes map integer ids to integer ids.
    """
    sh, sw = source[2] - source[0], source[3] - source[1]
    th, tw = target[2] - target[0], target[3] - target[1]
    scale = (th / sh, tw / sw)
    if fit == "contain":
        scale = (min(scale),) * 2
    centre_s = ((source[0] + source[2]) / 2, (source[1] + source[3]) / 2)
    centre_t = ((target[0] + target[2]) / 2, (target[1] + target[3]) / 2)
    return tuple((s, ct - s * cs) for s, cs, ct in zip(scale, centre_s, centre_t))


def transplant_ids(grid: tuple[int, int], sources, target_tokens: torch.Tensor, fit: str = "contain",
                   swap: bool = False, round_positions: bool = False) -> torch.Tensor:
    """Canvas ids ``[rows * cols, 3]`` float32 with each source token set moved onto the target box.

    ``sources`` is one ``[rows, cols]`` bool mask or a list (one per reference view, each mapped by its own
    bounding box); ``target_tokens`` is ``[rows, cols]`` bool. A source token at ``(r, c)`` gets
    ``(0, a_r (r + 0.5) + b_r - 0.5, a_c (c + 0.5) + b_c - 0.5)``, the similarity transform between the two
    bounding boxes; with ``swap`` the target tokens get the inverse map of the first source (onto its box).
    """
    sources = [sources] if isinstance(sources, torch.Tensor) else list(sources)
    if not sources or any(not bool(s.any()) for s in sources):
        raise ValueError("a reference object covers no token (more than object_coverage of one); enlarge the "
                         "object mask or tile_fraction, or lower object_coverage")
    if not bool(target_tokens.any()):
        raise ValueError("the target region covers no token; enlarge the target mask")
    ids = native_ids(grid)
    target_bounds = mask_bbox(target_tokens)  # (top, left, bottom, right) in tokens
    maps = [_box_map(mask_bbox(source), target_bounds, fit) for source in sources]
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


class TransplantIds:
    """Pre-forward rewriter: use the transplanted ids while ``sigma >= tau``, the pipeline's ids otherwise."""

    def __init__(self, ids: torch.Tensor, tau: float):
        self.ids, self.tau = ids, tau

    def active(self, sigma: float) -> bool:
        return sigma >= self.tau

    def __call__(self, context, kwargs):
        native = kwargs["img_ids"]
        if not self.active(context.sigma):
            return kwargs
        if native.shape[-2:] != self.ids.shape:
            raise ValueError(f"transplanted ids {tuple(self.ids.shape)} do not match the pipeline's img_ids "
                             f"{tuple(native.shape)}; the canvas and the call's height/width disagree")
        return {**kwargs, "img_ids": self.ids.to(device=native.device, dtype=native.dtype)}


def token_sets(canvas: Canvas, config: TransplantConfig):
    """(list of source token masks, one per transplanted view; target token mask), ``[rows, cols]`` bool."""
    grid = canvas.layout.grid
    target = mask_to_tokens(canvas.inpaint_mask, grid, threshold=0.0)
    views = canvas.object_masks if config.transplant_views == "all" else canvas.object_masks[:1]
    return [mask_to_tokens(mask, grid, threshold=config.object_coverage) for mask in views], target
