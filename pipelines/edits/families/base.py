"""The edit seam: what an edit rule sees of one attention layer call, on any tier-2 family.

A family's :class:`FamilyEditAttention` adapter turns one call of the layer's processor into a :class:`LayerCall`:
q, k, v ``[B, S, H, D]`` over the joint sequence (after the qk norms, before RoPE, in the stock processor's
arithmetic), the :class:`~mmpos.pipelines.edits.segments.TokenSegments` of that sequence (found from the family's
coordinates), the layer's :class:`~mmpos.integrations.diffusers.LayerRotation` (the table and operator of the
processor beneath: stock, or ``set_pe``'s), the key mask the stock processor applies, and ``finish`` (merge heads,
output projections, split text / image as the processor returns them). A rule written against a ``LayerCall``
(``rule.attend_call(call, context)``) runs on every family that has an adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn

from mmpos.integrations.diffusers.layer_rotation import LayerRotation
from mmpos.ops.tables import RotaryTable

from ..segments import TokenSegments


@dataclass
class LayerCall:
    """One attention layer call as a rule sees it.

    Attributes:
        attn: the attention module.
        query, key, value: ``[B, S, H, D]`` over the joint sequence, before RoPE.
        segments: token ranges of the joint sequence.
        rotation: the layer's table and operator (``rotation(x)``, ``rotation(x, table)``).
        key_mask: ``[B, S]`` bool (True: attend) the stock processor applies, or ``None``.
        finish: ``finish(out [B, S, H, D], dtype)`` -> what the processor returns.
    """

    attn: Any
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    segments: TokenSegments
    rotation: LayerRotation
    key_mask: Optional[torch.Tensor]
    finish: Callable[[torch.Tensor, torch.dtype], Any]

    def attend(self, query, key, value, key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``dispatch_attention_fn`` with the layer's backend; ``key_mask [B, S_k]`` bool as the stock processors
        pass it (``[B, 1, 1, S_k]``)."""
        processor = self.attn.processor
        mask = None if key_mask is None else key_mask[:, None, None, :]
        return dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=mask,
            backend=getattr(processor, "_attention_backend", None),
            parallel_config=getattr(processor, "_parallel_config", None),
        )


class FamilyEditAttention:
    """A family's edit adapter (one instance per family; subclasses in :mod:`mmpos.pipelines.edits.families`).

    ``processor_class(slot)`` gives the edit processor class whose ``__call__`` has the layer's stock signature;
    ``observe`` runs in the edit's pre-forward hook and records this forward's coordinates on the context
    (``context.segments``, ``context.layout``); the rest build the :class:`LayerCall` of one layer call.
    """

    family: str = ""

    def processor_class(self, slot) -> type:
        raise NotImplementedError

    def sigma(self, args, kwargs) -> torch.Tensor:
        """This forward's sigma ``[1]`` in the scheduler's convention (``timesteps / 1000``)."""
        raise NotImplementedError

    def observe(self, context, module, args, kwargs) -> None:
        """Record this forward's token segments (``context.segments``) from the family's coordinates."""
        raise NotImplementedError

    def segments(self, context, slot, inputs: dict) -> Optional[TokenSegments]:
        """The segments of this layer's joint sequence (``None``: the layer sees no image tokens)."""
        return context.segments

    def project(self, attn, inputs: dict):
        """``(query, key, value, state)``: ``[B, S, H, D]`` before RoPE, and what ``finish`` needs."""
        raise NotImplementedError

    def rotary_emb(self, inputs: dict):
        """The rotary embedding the layer got (what :meth:`rotation` reads)."""
        raise NotImplementedError

    def rotation(self, beneath, rotary_emb, layer: int) -> LayerRotation:
        return LayerRotation.of_processor(beneath, rotary_emb, layer)

    def key_mask(self, inputs: dict, segments: TokenSegments, batch: int, length: int):
        return None

    def finish(self, attn, inputs: dict, state, out: torch.Tensor, dtype: torch.dtype):
        raise NotImplementedError

    # coordinate edits (LooseRoPE): the family's image coordinates and the tables at other coordinates
    spatial_axes = (1, 2)  # the row and column axes of image_coords

    def image_coords(self, inputs: dict) -> torch.Tensor:
        """``[S_img, A]`` fp32 coordinates of this forward's image tokens (``inputs``: the transformer's keyword
        inputs), in sequence order."""
        raise NotImplementedError(f"the {self.family} edit adapter gives no image coordinates (coordinate edits)")

    def table_at(self, transformer, inputs: dict, image_coords: torch.Tensor):
        """The rotary embedding the model's position module gives ``[text | image tokens at image_coords]``, in the
        format the layers read (what :meth:`layer_table` turns into a layer's table)."""
        raise NotImplementedError(f"the {self.family} edit adapter gives no tables at other coordinates")

    def layer_table(self, rotation: LayerRotation, emb) -> RotaryTable:
        """A layer's table of the embedding :meth:`table_at` gave."""
        return rotation.table_of(emb)

    # position rewrites (PE transplant): the tokens of an image grid moved to other coordinates, per forward
    def grid_coords(self, ids: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """FLUX.1-style ids ``[N, 3]`` ``(index, row, col)`` of a ``rows x cols`` image grid (the output image), in
        this family's coordinates ``[N, A]``."""
        raise NotImplementedError(f"the {self.family} edit adapter moves no positions (PE transplant)")

    def position_module(self, transformer):
        """The module whose forward gives the rotary tables (what :meth:`move_table` rewrites)."""
        return transformer.pos_embed

    def move_ids(self, kwargs: dict, coords: torch.Tensor, grid: tuple[int, int]) -> dict:
        """The transformer's keyword inputs with the grid tokens' ids set to ``coords`` (``[N, A]``, from
        :meth:`grid_coords`); families whose forward takes no ids return ``kwargs`` (their tables move instead)."""
        raise NotImplementedError(f"the {self.family} edit adapter moves no positions (PE transplant)")

    def move_table(self, module, args, kwargs, output, coords, moved, grid, cache: dict):
        """The output of the position ``module`` with the rows of the ``moved [N]`` grid tokens at ``coords``, or
        ``None`` (unchanged: a family whose forward takes ids). ``cache``: kept by the caller across forwards."""
        return None

    def layer_call(self, processor, attn, inputs: dict) -> Optional[LayerCall]:
        """The :class:`LayerCall` of ``processor``'s layer for this call, or ``None`` (no image tokens here)."""
        segments = self.segments(processor.context, processor.slot, inputs)
        if segments is None or segments.target_len == 0:
            return None
        return self.make_call(attn, inputs, segments, processor.layer_rotation(self, self.rotary_emb(inputs)))

    def make_call(
        self, attn, inputs: dict, segments: TokenSegments, rotation: LayerRotation, kind=LayerCall, **extra
    ) -> LayerCall:
        """The :class:`LayerCall` of ``attn`` called with ``inputs`` (the stock processor's arguments by name); a
        family's subclass ``kind`` gets its own fields ``extra``."""
        query, key, value, state = self.project(attn, inputs)
        mask = self.key_mask(inputs, segments, query.shape[0], query.shape[1])

        def finish(out, dtype):
            return self.finish(attn, inputs, state, out, dtype)

        return kind(attn, query, key, value, segments, rotation, mask, finish, **extra)


def grid_cells(coords: torch.Tensor, grid: tuple[int, int], offset: tuple[float, float] = (0.0, 0.0)) -> torch.Tensor:
    """Grid cell ``row * cols + col`` of each token whose spatial coordinates ``coords [S, 2]`` (minus ``offset``)
    are an integer cell of the ``rows x cols`` grid; an error when any is not (the pipeline's ids and the canvas
    disagree)."""
    rows, cols = grid
    r = coords[:, 0].double() - offset[0]
    c = coords[:, 1].double() - offset[1]
    if bool(((r != r.round()) | (c != c.round()) | (r < 0) | (r >= rows) | (c < 0) | (c >= cols)).any()):
        raise ValueError(
            f"the canvas tokens' coordinates do not form the {rows}x{cols} canvas grid; the canvas and "
            "the pipeline's height/width disagree"
        )
    return r.long() * cols + c.long()
