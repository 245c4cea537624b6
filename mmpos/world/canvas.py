"""Fill canvases: the world's inpainting examples laid out as PE transplant lays out its canvas.

The world's Fill model is trained on ``S x 2S`` canvases, the reference tile left of the scene
(``side_by_side`` layout of :mod:`mmpos.coords.canvas`, composed as :mod:`mmpos.pipelines.edits.transplant.canvas` composes
its canvas; the world does not import the pipelines): half of the examples insert the tile's object at a box in the scene (the scene with the object drawn there is the target),
half inpaint a region of the scene beside a plain tile. So ``PosBridgeFillPipeline`` with
:data:`WORLD_TRANSPLANT` meets exactly the layout the model was trained on, and plain Fill (the same pipeline with
``enabled=False``) is the baseline on the same canvas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..coords.canvas import CANVAS_LAYOUTS
from ..coords.edits import mask_bbox
from .edit_pairs import TransplantPair, fill_example, transplant_pair
from .images import to_chw, to_uint8

TOKEN_PIXELS = 4  # world VAE factor 2 x Flux 2x2 packing
WORLD_TRANSPLANT = {"layout": "side_by_side", "tile_fraction": 1.0}  # TransplantConfig options of the world
FILL_VALUE, MASK_DILATE_TOKENS = 0.5, 1  # TransplantConfig's defaults: the canvas ground, Fill's mask dilation
INSERTION_FRACTION = 0.5


@dataclass
class FillCanvas:
    image: np.ndarray  # uint8 [S, 2S, 3]: the target canvas (reference tile | scene after the edit)
    mask: np.ndarray  # bool [S, 2S]: the region Fill repaints (inside the scene)
    caption: str  # the edited scene's caption
    spec: dict  # the edited scene's spec
    inserted: bool  # True: the tile's object goes into the mask; False: plain inpainting


def insertion_canvas(pair: TransplantPair) -> FillCanvas:
    """The transplant pipeline's canvas for ``pair`` with the target scene in place of the background: on
    :data:`WORLD_TRANSPLANT`'s layout, the reference cropped to its object and fitted in the tile (aspect kept,
    centred, antialiased bilinear) on a ``FILL_VALUE`` ground, and Fill's mask the box dilated by
    ``MASK_DILATE_TOKENS`` tokens, as :func:`mmpos.pipelines.edits.transplant.canvas.compose_canvas` builds them (a test
    holds the two equal)."""
    size = pair.background.image.shape[:2]
    layout = CANVAS_LAYOUTS[WORLD_TRANSPLANT["layout"]](*size, 1, WORLD_TRANSPLANT["tile_fraction"], TOKEN_PIXELS)
    image = torch.full((1, 3, *layout.canvas_size), FILL_VALUE)
    rows, cols = layout.background.slices
    image[..., rows, cols] = to_chw(pair.target.image)
    tile = layout.tiles[0]
    t_rows, t_cols = tile.slices
    image[..., t_rows, t_cols] = _fitted(
        to_chw(pair.reference.image)[None], torch.from_numpy(pair.reference.masks[0]), tile.height, tile.width
    )
    left, top, right, bottom = pair.box
    box = torch.zeros(size, dtype=torch.bool)
    box[top:bottom, left:right] = True
    mask = torch.zeros(layout.canvas_size, dtype=torch.bool)
    mask[rows, cols] = _dilated(box, MASK_DILATE_TOKENS * TOKEN_PIXELS)
    return FillCanvas(to_uint8(image)[0], mask.numpy(), pair.caption, pair.target.spec.to_dict(), True)


def _fitted(reference: torch.Tensor, object_mask: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``[1, 3, height, width]``: ``reference [1, 3, H, W]`` cropped to ``object_mask``'s box, fitted inside."""
    top, left, bottom, right = mask_bbox(object_mask)
    crop = reference[..., top:bottom, left:right]
    scale = min(height / crop.shape[-2], width / crop.shape[-1])
    h, w = max(1, round(crop.shape[-2] * scale)), max(1, round(crop.shape[-1] * scale))
    if (h, w) != tuple(crop.shape[-2:]):
        crop = F.interpolate(crop, size=(h, w), mode="bilinear", antialias=True, align_corners=False).clamp(0, 1)
    pixels = torch.full((1, 3, height, width), FILL_VALUE, dtype=reference.dtype)
    y, x = (height - h) // 2, (width - w) // 2
    pixels[..., y : y + h, x : x + w] = crop
    return pixels


def _dilated(mask: torch.Tensor, radius: int) -> torch.Tensor:
    """``[H, W]`` bool grown by ``radius`` pixels (a square structuring element)."""
    if radius <= 0:
        return mask
    return F.max_pool2d(mask[None, None].float(), 2 * radius + 1, stride=1, padding=radius)[0, 0] > 0


def inpainting_canvas(seed: int, image_size: int) -> FillCanvas:
    """A scene beside a plain grey tile, with :func:`~mmpos.world.edit_pairs.fill_example`'s mask."""
    rendered, mask = fill_example(seed, image_size)
    image = np.full((image_size, 2 * image_size, 3), 128, dtype=np.uint8)
    image[:, image_size:] = rendered.image
    full_mask = np.zeros((image_size, 2 * image_size), dtype=bool)
    full_mask[:, image_size:] = mask
    return FillCanvas(image, full_mask, rendered.spec.caption(), rendered.spec.to_dict(), False)


def fill_canvas_example(seed: int, image_size: int = 64, insertion_fraction: float = INSERTION_FRACTION):
    """One Fill training canvas: an insertion (:func:`insertion_canvas`) with probability
    ``insertion_fraction``, else plain inpainting."""
    rng = np.random.default_rng(seed)
    sub_seed = int(rng.integers(2**31))
    if rng.random() < insertion_fraction:
        return insertion_canvas(transplant_pair(sub_seed, image_size))
    return inpainting_canvas(sub_seed, image_size)


def scene_part(canvas_image: np.ndarray) -> np.ndarray:
    """The scene (right half) of a ``[S, 2S, ...]`` canvas."""
    return canvas_image[:, canvas_image.shape[0] :]
