"""Base class of rotary encodings: coordinates -> cached table -> rotation of q and k.

A subclass implements :meth:`RotaryPE.compute_table` (coordinates -> table) and, when the table depends on
more than its parameters, :meth:`RotaryPE.table_key`. Validation, caching (one :class:`TableCache` per
instance) and the rotation come from the base.
"""

from __future__ import annotations

from typing import Union

import torch
from torch.types import Device

from .._validation import check_choice, check_non_negative_int, check_positive_int
from ..ops.block_rotation import BlockRotationTable
from ..ops.phasors import rotate_pair, trains_phases
from ..ops.rotation import LAYOUTS, compute_dtype, rotate
from ..ops.tables import RotaryTable, TableCache, check_coords
from .base import Capabilities, PEKind, PositionalEncoding, parameters_key

Table = Union[RotaryTable, BlockRotationTable]  # what compute_table builds and rotate reads


class RotaryPE(PositionalEncoding):
    """``q, k = pe(q, k, coords)``.

    q, k: ``[B, H, L, D]`` (``seq_dim=-2``) or ``[B, L, H, D]`` (``seq_dim=-3``); coords: ``[L', A]`` or
    ``[B, L', A]`` float with ``L' = L - num_prefix_tokens``. Subclasses implement :meth:`compute_table`.
    Tables are built once per coordinates/dtype/device and shared by every layer and step.
    """

    kind = PEKind.ROTARY
    capabilities = Capabilities(relative=True)
    cache_entries = 16  # tables kept per instance (one per coordinates, key and dtype)

    def __init__(self, head_dim: int, num_axes: int, layout: str, num_prefix_tokens: int, seq_dim: int):
        super().__init__()
        check_positive_int("head_dim", head_dim)
        check_positive_int("num_axes", num_axes)
        check_choice("layout", layout, LAYOUTS)
        check_choice("seq_dim", seq_dim, (-2, -3))
        check_non_negative_int("num_prefix_tokens", num_prefix_tokens)
        self.head_dim, self.num_axes, self.layout = head_dim, num_axes, layout
        self.num_prefix_tokens, self.seq_dim = num_prefix_tokens, seq_dim
        self.rotary_dim = head_dim  # channels a table rotates; partial-rotary subclasses set fewer
        self.cache = TableCache(max_entries=self.cache_entries)

    # ----- the two hooks of a subclass ----------------------------------------------------------------------
    def compute_table(self, coords: torch.Tensor, complex_dtype: torch.dtype) -> Table:
        """A fresh table for validated coords ``[L, A]`` or ``[B, L, A]`` (on the target device):
        a :class:`RotaryTable` ``[..., L, P]`` (complex ``complex_dtype``) or another table :meth:`rotate` reads."""
        raise NotImplementedError

    def table_key(self, complex_dtype: torch.dtype) -> tuple | None:
        """What the table depends on besides the coordinates; ``None``: do not cache (a gradient is needed).

        Default: the parameters' versions (:func:`~.base.parameters_key`) and the precision.
        """
        params = parameters_key(self.parameters())
        return None if params is None else params + (complex_dtype,)

    # ----- provided -----------------------------------------------------------------------------------------
    def table(self, coords: torch.Tensor, dtype: torch.dtype = torch.float32, device: Device = None) -> Table:
        """The rotation table for activations of ``dtype`` on ``device`` (cached where :meth:`table_key` allows)."""
        coords = check_coords(coords, self.num_axes)
        device = torch.device(device) if device is not None else coords.device
        if device.type == "meta":  # autocast and the phases need data: torch says only "unsupported scalarType"
            raise ValueError(
                "q/k (or device=) are on the meta device: tables hold values; materialise the model "
                "(to_empty + load the weights) or pass tensors on cpu/cuda"
            )
        coords = coords.to(device)
        real = compute_dtype(dtype, device)
        return self.cached_table(coords, torch.complex128 if real == torch.float64 else torch.complex64)

    def cached_table(self, coords: torch.Tensor, complex_dtype: torch.dtype) -> Table:
        """:meth:`compute_table` through the cache (coords already validated and on the target device)."""
        key = self.table_key(complex_dtype)
        if key is None:
            return self.compute_table(coords, complex_dtype)
        return self.cache.get(key, coords, lambda: self.compute_table(coords, complex_dtype))

    @property
    def rotated_prefix(self) -> int:
        """Leading tokens left unrotated."""
        return self.num_prefix_tokens

    def check_rotatable(self, x: torch.Tensor, table: Table | None = None) -> None:
        """Raise if ``x`` (q or k), or ``table``'s pair count, does not fit this encoding."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x has head dim {x.shape[-1]}; this encoding was built for head_dim={self.head_dim}")
        if isinstance(table, RotaryTable) and 2 * table.num_pairs != self.rotary_dim:
            raise ValueError(
                f"table rotates {2 * table.num_pairs} channels but this encoding rotates "
                f"rotary_dim={self.rotary_dim}; use a table from this encoding's table()"
            )

    def rotate(self, x: torch.Tensor, table: Table) -> torch.Tensor:
        """Rotate one tensor (q or k) by a table from :meth:`table`."""
        if isinstance(table, BlockRotationTable):  # only block-rotary encodings (their own rotate) read these
            raise TypeError(f"{type(self).__name__} rotates by a RotaryTable, got a BlockRotationTable")
        self.check_rotatable(x, table)
        return rotate(x, table, self.layout, seq_dim=self.seq_dim, num_prefix_tokens=self.rotated_prefix)

    def rotate_qk(
        self, q: torch.Tensor, k: torch.Tensor | None, table: Table
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(q, k)`` encoded with a table from :meth:`table`: the hook integrations call when they hold tables
        themselves. Default: :meth:`rotate` each, or, for a table of learned phases in training, both in one
        autograd node (:func:`~mmpos.ops.phasors.rotate_pair`); encodings that treat q and k differently (HARoPE)
        override it. ``k=None`` encodes q alone and returns ``(q, None)``."""
        if k is not None and isinstance(table, RotaryTable) and trains_phases(table):
            self.check_rotatable(q, table)
            self.check_rotatable(k, table)
            return rotate_pair(q, k, table, self.layout, seq_dim=self.seq_dim, num_prefix_tokens=self.rotated_prefix)
        return self.rotate(q, table), (None if k is None else self.rotate(k, table))

    def coords_from_position_ids(self, coords: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
        """``coords`` as :meth:`forward` received them, in mmpos' ``[L, A]`` / ``[B, L, A]`` layout. Encodings that
        read transformers' position ids (``rope_1d``: ``[B, L]``; the MRoPE family: ``[3, B, L]``) move the axis
        last here (:func:`~mmpos.encodings.position_ids.as_axis_last`); the default returns them unchanged."""
        return coords

    def default_coords(self, length: int, device: Device) -> torch.Tensor:
        """Coordinates ``[length, A]`` for a call without any (none by default: an error)."""
        raise ValueError(f"{type(self).__name__} needs coords of shape [L, {self.num_axes}] or [B, L, {self.num_axes}]")

    def forward(
        self, q: torch.Tensor, k: torch.Tensor | None, coords: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(q, k)`` encoded at ``coords`` (``[L, A]`` or ``[B, L, A]``). ``k=None`` encodes q alone, e.g. the new
        token when decoding against cached keys that were encoded when they were computed: returns ``(q, None)``."""
        check_query_key(q, k, self.seq_dim)
        coords = self.coords_from_position_ids(coords, q)
        if coords is None:
            coords = self.default_coords(q.shape[self.seq_dim] - self.num_prefix_tokens, q.device)
        table = self.table(coords, q.dtype, q.device)
        return self.rotate_qk(q, k, table)

    def frequency_matrix(self) -> torch.Tensor:
        """``[A, P]`` (or ``[H, A, P]`` for per-head spectra) radians per coordinate unit, for plots."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_axes={self.num_axes}, layout={self.layout!r}, "
            f"num_prefix_tokens={self.num_prefix_tokens}"
        )


def check_query_key(q: torch.Tensor, k: torch.Tensor | None, seq_dim: int) -> None:
    """q and k (unless ``None``) are tensors that share head dim, sequence length and dtype."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a tensor, got {type(q).__name__}")
    if k is None:
        return
    check_key_or_none(k)
    if q.shape[-1] != k.shape[-1] or q.shape[seq_dim] != k.shape[seq_dim]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share head dim and sequence length")
    if q.dtype != k.dtype:
        raise TypeError(f"q ({q.dtype}) and k ({k.dtype}) must have the same dtype")


def check_key_or_none(k: object) -> None:
    """``k`` is a tensor or ``None``."""
    if k is not None and not isinstance(k, torch.Tensor):
        raise TypeError(f"k must be a tensor or None (encode q alone), got {type(k).__name__}")
