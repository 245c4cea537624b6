"""``nope``: no positional encoding (the baseline every comparison needs)."""

from __future__ import annotations

import torch

from .._validation import check_positive_int
from ..ops.tables import check_coords
from .base import Capabilities, PEKind, PositionalEncoding
from .registry import register_pe
from .rotary_base import check_key_or_none


@register_pe("nope")
class NoPE(PositionalEncoding):
    """No positional encoding: ``q, k = pe(q, k, coords)`` returns its inputs unchanged (attention sees
    content only; causal masks still leak order in decoders). Relative trivially: logits do not depend on
    coordinates at all."""

    description = "No positional encoding: q and k are returned unchanged."

    kind = PEKind.NONE
    capabilities = Capabilities(relative=True, reads_image_grid=True)
    example_options = dict(head_dim=16)

    def __init__(self, head_dim: int | None = None, num_axes: int = 2):
        super().__init__()
        if head_dim is not None:
            check_positive_int("head_dim", head_dim)
        check_positive_int("num_axes", num_axes)
        self.head_dim, self.num_axes = head_dim, num_axes

    def forward(
        self, q: torch.Tensor, k: torch.Tensor | None, coords: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(q, k)`` unchanged (``k=None``: ``(q, None)``); coordinates, when given, are validated."""
        check_key_or_none(k)
        if coords is not None:
            check_coords(coords, self.num_axes)
        return q, k
