"""Fill canvases: the world's inpainting examples laid out as PE transplant lays out its canvas.

The world's Fill model is trained on ``S x 2S`` canvases, the reference tile left of the scene
(``side_by_side`` layout of :mod:`mmpos.pipelines.transplant`, built by its own ``compose_canvas``): half of the
examples insert the tile's object at a box in the scene (the scene with the object drawn there is the target),
half inpaint a region of the scene beside a plain tile. So ``PosBridgeFillPipeline`` with
:data:`WORLD_TRANSPLANT` meets exactly the layout the model was trained on, and plain Fill (the same pipeline with
``enabled=False``) is the baseline on the same canvas.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .edit_pairs import TransplantPair, fill_example, transplant_pair
from .images import to_chw, to_uint8

TOKEN_PIXELS = 4  # world VAE factor 2 x Flux 2x2 packing
WORLD_TRANSPLANT = {"layout": "side_by_side", "tile_fraction": 1.0}  # TransplantConfig options of the world
INSERTION_FRACTION = 0.5


@dataclass
class FillCanvas:
    image: np.ndarray   # uint8 [S, 2S, 3]: the target canvas (reference tile | scene after the edit)
    mask: np.ndarray    # bool [S, 2S]: the region Fill repaints (inside the scene)
    caption: str        # the edited scene's caption
    spec: dict          # the edited scene's spec
    inserted: bool      # True: the tile's object goes into the mask; False: plain inpainting


def insertion_canvas(pair: TransplantPair) -> FillCanvas:
    """The transplant pipeline's canvas for ``pair`` with the target scene in place of the background."""
    from mmpos.pipelines.transplant import TransplantConfig, compose_canvas
    from mmpos.pipelines.transplant_pipeline import box_to_mask

    size = pair.background.image.shape[:2]
    canvas = compose_canvas(TransplantConfig(**WORLD_TRANSPLANT), to_chw(pair.background.image)[None],
                            box_to_mask(pair.box, size), [to_chw(pair.reference.image)[None]],
                            [torch.from_numpy(pair.reference.masks[0])], TOKEN_PIXELS)
    rows, cols = canvas.layout.background.slices
    image = canvas.image.clone()
    image[..., rows, cols] = to_chw(pair.target.image)
    return FillCanvas(to_uint8(image)[0], canvas.inpaint_mask.numpy(), pair.caption, pair.target.spec.to_dict(),
                      True)


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
    return canvas_image[:, canvas_image.shape[0]:]
