"""The rotation one attention layer applies, as an mmpos table and operator (what edit rules rotate with).

A Flux position module returns diffusers' stock ``(cos, sin)`` ``[S, D]`` (the stock model, or
``set_pe(pe="native")``) or, under ``set_pe`` with an mmpos encoding, a ``LayerTables`` tuple. Either way
:class:`LayerRotation` gives the layer's :class:`~mmpos.ops.tables.RotaryTable` (``[..., S, P]``) and rotates
``[B, S, H, D]`` tensors with the mmpos operator: :func:`mmpos.ops.rotation.rotate` (interleaved pairs, Flux's
layout) for the stock format, the encoding's own ``rotate`` for an mmpos encoding. A rule that edits the
rotation (other coordinates, a per-pair magnitude) builds another table and rotates with the same operator.

Numerics: in fp32 and fp64, the stock-format rotation is bit-identical to diffusers' ``apply_rotary_emb``. For
16-bit q/k on the CPU, :func:`~mmpos.ops.rotation.rotate` rounds the exact rotation once, while
``apply_rotary_emb`` rounds its fp32 sum again to 16 bits: about 1e-5 (bf16) and 8e-5 (fp16) of the elements
differ by one 16-bit ulp (measured on ``[2, 1032, 4, 128]`` Gaussian q, FLUX.1 ids).
"""

from __future__ import annotations

import torch

from ...encodings.rotary_base import RotaryPE
from ...ops.rotation import rotate as rotate_pairs
from ...ops.tables import RotaryTable
from .positions import LayerTables
from .processors import EncodingRotation


def stock_table(cos: torch.Tensor, sin: torch.Tensor) -> RotaryTable:
    """diffusers' Flux ``(cos, sin)`` ``[S, D]`` (each value repeated on a pair's two channels) as a table
    ``[S, D/2]`` (complex64, or complex128 for fp64 inputs)."""
    real = torch.float64 if cos.dtype == torch.float64 else torch.float32
    return RotaryTable(torch.complex(cos[..., 0::2].to(real), sin[..., 0::2].to(real)))


class LayerRotation:
    """The table and operator of attention layer ``layer``.

    Args:
        rotary_emb: what the position module returned this forward (stock ``(cos, sin)`` or ``LayerTables``).
        rotation: the ``set_pe`` processor's :class:`EncodingRotation`, or ``None`` for the stock format.
        layer: the attention layer index (selects a per-layer encoding's table).
    """

    def __init__(self, rotary_emb, rotation: EncodingRotation | None = None, layer: int = 0):
        self.rotation = rotation
        self.index = 0 if rotation is None or not rotation.per_layer else layer
        encoding = None if rotation is None else rotation.encodings[self.index]
        own_qk = getattr(type(encoding), "rotate_qk", None)
        if own_qk is not None and own_qk is not getattr(RotaryPE, "rotate_qk", None):
            raise NotImplementedError(
                f"{type(encoding).__name__} rotates q and k with different operators; edits "
                "rotate both with one operator"
            )
        self.encoding = encoding
        self.table = self.table_of(rotary_emb)

    @classmethod
    def of_processor(cls, processor, rotary_emb, layer: int) -> "LayerRotation":
        """The rotation ``processor`` (the one an edit runs over) applies at ``layer``."""
        rotation = getattr(processor, "rotation", None)
        return cls(rotary_emb, rotation if isinstance(rotation, EncodingRotation) else None, layer)

    @classmethod
    def wrap(cls, rotary_emb) -> "LayerRotation":
        """``rotary_emb`` itself when it is already a :class:`LayerRotation`, else the stock format's."""
        return rotary_emb if isinstance(rotary_emb, LayerRotation) else cls(rotary_emb)

    def table_of(self, rotary_emb) -> RotaryTable:
        """This layer's table in another output of the same position module (e.g. for edited ids)."""
        if isinstance(rotary_emb, RotaryTable):
            return rotary_emb
        if self.rotation is None:
            if isinstance(rotary_emb, LayerTables) or len(rotary_emb) != 2:
                raise TypeError(
                    "expected diffusers' (cos, sin) rotary embedding; an mmpos encoding's tables need "
                    "the set_pe processor's rotation"
                )
            return stock_table(*rotary_emb)
        return self.rotation.table(rotary_emb, self.index)

    @property
    def axis_of_pair(self) -> torch.Tensor | None:
        """The axis each pair of the table reads, when the encoding has a spectrum (``None`` for the stock one)."""
        spectrum = getattr(self.encoding, "spectrum", None)
        return None if spectrum is None else spectrum.axis_of_pair

    def __call__(self, x: torch.Tensor, table: RotaryTable | None = None) -> torch.Tensor:
        """Rotate ``x`` ``[B, S, H, D]`` by ``table`` (default: the layer's)."""
        table = self.table if table is None else table
        if self.encoding is None:
            return rotate_pairs(x, table, "interleaved", seq_dim=-3)
        return self.encoding.rotate(x, table)


def sequence_slice(table: RotaryTable, tokens) -> RotaryTable:
    """The rows ``tokens`` (a slice or an index tensor) of a table ``[..., S, P]``."""
    return RotaryTable(table.cis[..., tokens, :])


def scale_pairs(table: RotaryTable, pair_scale: torch.Tensor) -> RotaryTable:
    """The table with each pair's magnitude multiplied by ``pair_scale`` ``[P]`` (a spectrum's per-pair
    ``magnitude``, applied to a built table)."""
    scale = pair_scale.to(table.cis.device, table.cis.real.dtype)
    return RotaryTable(table.cis * scale)
