"""Where a user's image sits in a model's input, and the way back.

A world model takes ``side x side`` pixels: a photo is fitted into that square with its aspect kept (resized so
its longer side is ``side``, the rest padded with its edge pixels), never squashed. A FLUX.1 model takes the
image's own size on its token grid (resized down to multiples of the token). One :class:`Placement` records
either, maps what the user gave in the file's pixels (boxes, masks, saliency maps) onto the model input, and
takes the model's output back: cropped to the picture, and resized to the file's size.

    600 x 400 photo, side 32:   content 21 x 32 at (top 5, left 0) of the 32 x 32 input (5 rows above, 6 below)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .images import area_resize, resize_image


@dataclass(frozen=True)
class Placement:
    """A ``source`` (H, W) image resized to ``content`` (h, w) and placed at ``offset`` (top, left) of a model
    input of size ``canvas`` (H', W'); pixels of the canvas outside the content are padding."""

    source: tuple[int, int]
    content: tuple[int, int]
    offset: tuple[int, int]
    canvas: tuple[int, int]

    @property
    def padding(self) -> tuple[int, int, int, int]:
        """``(left, right, top, bottom)`` padding pixels (``F.pad``'s order)."""
        (h, w), (top, left), (height, width) = self.content, self.offset, self.canvas
        return left, width - w - left, top, height - h - top

    @property
    def changed(self) -> bool:
        """Whether the model input differs in size from the file (resized or padded)."""
        return self.content != self.source or self.canvas != self.content

    def place_image(self, image: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` (any size: resized to ``content``) -> ``[B, 3, *canvas]``, padded with edge pixels."""
        return F.pad(resize_image(image, self.content), self.padding, mode="replicate")

    def place_map(self, values: torch.Tensor) -> torch.Tensor:
        """``[H, W]`` float map -> ``[*canvas]``: area-resized to ``content``, zero on the padding."""
        return F.pad(area_resize(values, self.content), self.padding)

    def place_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """``[H, W]`` bool mask -> ``[*canvas]`` bool: nearest-resized to ``content``, False on the padding."""
        resized = F.interpolate(mask[None, None].float(), size=self.content, mode="nearest")[0, 0]
        return F.pad(resized, self.padding) > 0.5

    def place_box(self, box) -> tuple[int, int, int, int]:
        """``(left, top, right, bottom)`` pixels of the source -> the same region of the model input (rounded
        outwards); a box outside the source raises ValueError naming ``--box``."""
        left, top, right, bottom = rescale_box(box, self.source, self.content)
        return left + self.offset[1], top + self.offset[0], right + self.offset[1], bottom + self.offset[0]

    def crop(self, image: torch.Tensor) -> torch.Tensor:
        """The content region of a model output ``[..., H, W]`` (the canvas, or any size covering the same view:
        the region is scaled with it)."""
        (h, w), (top, left), (height, width) = self.content, self.offset, self.canvas
        rows, cols = image.shape[-2] / height, image.shape[-1] / width
        return image[..., round(top * rows) : round((top + h) * rows), round(left * cols) : round((left + w) * cols)]

    def to_source(self, image: torch.Tensor) -> torch.Tensor:
        """A model output ``[3, H, W]`` or ``[B, 3, H, W]`` cropped to the content and resized to ``source``."""
        cropped = self.crop(image)
        batch = cropped if cropped.ndim == 4 else cropped[None]
        resized = resize_image(batch, self.source)
        return resized if cropped.ndim == 4 else resized[0]

    def describe(self, what: str, outputs_follow: bool = True) -> str | None:
        """One line saying how ``what`` was placed; None when the model gets the file's own size.
        ``outputs_follow``: the outputs are edits of ``what`` (cropped back to it, written at its size)."""
        (sh, sw), (h, w), (height, width) = self.source, self.content, self.canvas
        if not self.changed:
            return None
        if self.canvas == self.content:
            return f"{what}: resized {sh}x{sw} to {h}x{w}"
        left, right, top, bottom = self.padding
        pads = ", ".join(
            f"{n} px {side}" for n, side in ((top, "top"), (bottom, "bottom"), (left, "left"), (right, "right")) if n
        )
        return (
            f"{what}: {sh}x{sw} fitted into the {height}x{width} model input as {h}x{w}, aspect kept (padded "
            f"{pads} with its edge pixels)"
            + (f"; outputs are cropped back to {h}x{w} and also written at {sh}x{sw}" if outputs_follow else "")
        )


def rescale_box(box, from_size, to_size) -> tuple[int, int, int, int]:
    """``(left, top, right, bottom)`` pixels of a ``from_size`` (H, W) image -> the same region of the image
    resized to ``to_size``, rounded outwards; a box outside the image raises ValueError naming ``--box``."""
    left, top, right, bottom = (int(v) for v in box)
    (h0, w0), (h1, w1) = from_size, to_size
    if not (0 <= left < right <= w0 and 0 <= top < bottom <= h0):
        raise ValueError(
            f"--box {left} {top} {right} {bottom}: expected left < right <= {w0} and top < bottom <= "
            f"{h0} (L T R B pixels inside the {h0}x{w0} background)"
        )
    return (
        math.floor(left * w1 / w0),
        math.floor(top * h1 / h0),
        math.ceil(right * w1 / w0),
        math.ceil(bottom * h1 / h0),
    )


def fit_square(source: tuple[int, int], side: int) -> Placement:
    """A ``source`` (H, W) image in a ``side x side`` input: its longer side ``side``, centred, aspect kept."""
    height, width = (int(v) for v in source)
    if height <= 0 or width <= 0 or side <= 0:
        raise ValueError(f"image size {height}x{width} into side {side}: expected positive sizes")
    scale = side / max(height, width)
    content = (max(1, round(height * scale)), max(1, round(width * scale)))
    return Placement((height, width), content, ((side - content[0]) // 2, (side - content[1]) // 2), (side, side))


def on_token_grid(source: tuple[int, int], token_pixels: int) -> Placement:
    """A ``source`` (H, W) image resized down to multiples of ``token_pixels`` (FLUX.1's own-size inputs)."""
    height, width = (int(v) for v in source)
    content = tuple(max(token_pixels, v // token_pixels * token_pixels) for v in (height, width))
    return Placement((height, width), content, (0, 0), content)
