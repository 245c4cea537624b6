"""Where the tokens of one transformer forward sit in an attention layer's joint sequence.

A :class:`TokenSegments` names the text, the target image and the in-sequence reference images (Kontext's context
image, FLUX.2's reference images, Qwen-Image-Edit's condition images) as contiguous ranges of the joint sequence
one attention layer sees. Each family's edit adapter (:mod:`mmpos.pipelines.edits.families`) finds them from the
family's coordinates (FLUX.1: id axis 0; FLUX.2: ``t``; Qwen-Image: the frame index), never by the order of the
images in the inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class TokenSegments:
    """Sequence ranges of one layer's joint sequence.

    ``text_len`` text tokens start at ``text_start``; the ``target_len`` target image tokens at ``target_start``
    (default: right after the text, FLUX.1's ``[text | target | context]``) and the ``context_len`` reference
    tokens at ``context_start`` (default: right after the target); ``image`` is both (one block from
    ``image_start``). ``references`` holds each reference image's range, in the order of its
    coordinate (FLUX.2: ``t = 10, 20, ...``), inside ``context``.
    """

    text_len: int
    target_len: int
    context_len: int = 0
    target_grid: tuple[int, int] = (0, 0)  # (rows, cols) of the target token grid
    context_grid: tuple[int, int] = (0, 0)
    text_start: int = 0
    image_start: Optional[int] = None
    references: tuple = ()
    target_start: Optional[int] = None
    context_start: Optional[int] = None

    def __post_init__(self):
        if self.target_start is None:
            self.target_start = self.text_start + self.text_len if self.image_start is None else self.image_start
        if self.context_start is None:
            self.context_start = self.target_start + self.target_len
        if self.image_start is None:
            self.image_start = min(self.target_start, self.context_start)
        if not self.references and self.context_len:
            self.references = (self.context,)

    @property
    def text(self) -> slice:
        return slice(self.text_start, self.text_start + self.text_len)

    @property
    def target(self) -> slice:
        return slice(self.target_start, self.target_start + self.target_len)

    @property
    def context(self) -> slice:
        return slice(self.context_start, self.context_start + self.context_len)

    @property
    def image(self) -> slice:
        return slice(self.image_start, self.image_start + self.target_len + self.context_len)


def segments_from_ids(text_len: int, img_ids: torch.Tensor) -> TokenSegments:
    """FLUX.1: target tokens have id axis 0 == 0, Kontext context tokens == 1 (after the target, contiguous)."""
    if img_ids.ndim == 3:
        img_ids = img_ids[0]
    is_context = img_ids[:, 0] != 0
    target_len = int((~is_context).sum())
    if bool(is_context[:target_len].any()):
        raise ValueError("img_ids: expected the target tokens (axis 0 == 0) before the context tokens (axis 0 != 0)")
    return TokenSegments(
        text_len,
        target_len,
        img_ids.shape[0] - target_len,
        _grid_from_zero(img_ids[:target_len]),
        _grid_from_zero(img_ids[target_len:]),
    )


def _grid_from_zero(ids: torch.Tensor) -> tuple[int, int]:
    """FLUX.1's grid: rows and cols counted from 0 (``max + 1``)."""
    if ids.shape[0] == 0:
        return (0, 0)
    rows = int(ids[:, 1].max().round()) + 1
    cols = int(ids[:, 2].max().round()) + 1
    return (rows, cols) if rows * cols == ids.shape[0] else (0, 0)


def grid_shape(ids: torch.Tensor, rows_axis: int = 1, cols_axis: int = 2) -> tuple[int, int]:
    """``(rows, cols)`` of a full token grid in ``ids [N, A]`` (its extents on the two axes), else ``(0, 0)``."""
    if ids.shape[0] == 0:
        return (0, 0)
    rows = int((ids[:, rows_axis].max() - ids[:, rows_axis].min()).round()) + 1
    cols = int((ids[:, cols_axis].max() - ids[:, cols_axis].min()).round()) + 1
    return (rows, cols) if rows * cols == ids.shape[0] else (0, 0)


def runs_by_value(values: torch.Tensor) -> list[tuple[float, slice]]:
    """``(value, range)`` of each distinct value of ``values [N]``, sorted by value; each value's tokens must be
    one contiguous run (a ``ValueError`` otherwise)."""
    out = []
    for value in torch.unique(values).tolist():
        where = torch.nonzero(values == value).flatten()
        start, stop = int(where[0]), int(where[-1]) + 1
        if stop - start != where.numel():
            raise ValueError(f"the tokens at coordinate {value} are not contiguous in the sequence")
        out.append((value, slice(start, stop)))
    return out
