"""The seam's base: :class:`PositionSeam` replaces a diffusers transformer's position module; each family's seam
(``FluxPositions`` for Flux's ``pos_embed``, ``WanPositions`` for Wan's ``rope``, ...) lives in its module under
:mod:`.families`.

The model calls its position module once per forward and hands the result to every attention layer, so
tables built here are built once per forward, never per layer; each encoding's table cache then makes
equal coordinates (every step of a sampling run) reuse the same table.

What a seam returns is what its family's processors expect:

* native (``pe="native"``): the stock format, ``(cos, sin)`` repeated per channel (Flux ``[S, D]``,
  Wan ``[1, L, 1, D]``), with values equal bit for bit to the stock module's;
* an mmpos encoding on Flux: a :class:`LayerTables` tuple (one table per encoding);
* an mmpos encoding on Wan: ``(packed_tables, coords)``, two 4-D tensors with the sequence on dim 1 (the layout
  of Wan's context-parallel plan, which splits the position module's outputs ``0`` and ``1`` along dim 1).

Under Wan's context-parallel plan its seam builds only this rank's rows (:mod:`.context_parallel`).
"""

from __future__ import annotations

import weakref
from typing import Callable, Sequence

import torch
from torch import nn

from ..._per_thread import PerThread
from ...ops.tables import RotaryTable, device_has_fp64


class LayerTables(tuple):
    """One rotation table per encoding (one encoding shared by all layers, or one per layer)."""


def pack_tables(tables: Sequence[RotaryTable]) -> torch.Tensor:
    """Tables ``cis [..., L, P]`` (leading dims at most ``[B, H]``) as one real ``[b, L, G, 2P]`` tensor.

    The sequence is on dim 1 and groups (heads, then encodings) on dim 2, so that slicing dim 1 (context
    parallel sharding) slices every table consistently. A single table is packed without a copy.
    """
    packed = []
    for table in tables:
        cis = table.cis
        if cis.dim() > 4:
            raise ValueError(f"a table has shape {tuple(cis.shape)}; expected at most [B, H, L, P]")
        cis = cis.reshape((1,) * (4 - cis.dim()) + tuple(cis.shape))  # [b, h, L, P]
        packed.append(torch.view_as_real(cis.movedim(2, 1)).flatten(-2))  # [b, L, h, 2P]
    if len(packed) == 1:
        return packed[0]
    batch = max(p.shape[0] for p in packed)
    return torch.cat([p.expand(batch, *p.shape[1:]) for p in packed], dim=2)


def unpack_table(packed: torch.Tensor, start: int, groups: int) -> RotaryTable:
    """The table packed at groups ``start : start + groups`` of :func:`pack_tables`' output, ``[b, g, L, P]``."""
    part = packed[:, :, start : start + groups]
    return RotaryTable(torch.view_as_complex(part.unflatten(-1, (-1, 2))).movedim(1, 2))


class PositionSeam(nn.Module):
    """Coordinates -> one table per encoding, once per forward.

    Args:
        encodings: the mmpos encodings (one, or one per attention layer); empty for ``nope``.
        native: return the stock ``(cos, sin)`` format (the processors then use the stock arithmetic).
        coord_axes: which of the model's coordinate axes the encodings read (default: all).

    Attributes:
        coords_transform: optional ``f(coords [L, A]) -> coords [L, A']`` applied after axis selection
            (position edits; must use global quantities only, see the context-parallel notes).
        table_builds: tables built so far (a cached table reused by a later forward is not counted).
        forwards: forward calls so far (eager ones: see :meth:`count_forward`).
    """

    def __init__(self, encodings: Sequence[nn.Module], native: bool, coord_axes: tuple[int, ...] | None):
        super().__init__()
        self.encodings = nn.ModuleList(encodings)
        self.native = native
        self.coord_axes = coord_axes
        self.coords_transform: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.activation_dtype: torch.dtype | None = None  # set by the transformer's pre-forward hook
        self.table_builds = 0
        self.forwards = 0
        self._seen_tables = weakref.WeakSet()
        self._native_cache: tuple | None = None
        self._memo: list = []  # (key, output) of recent forwards, newest first (:meth:`memo`)
        self.global_inputs = PerThread(())  # this forward's whole-sequence inputs (:mod:`.global_extents`)

    def encoding_coords(self, coords: torch.Tensor) -> torch.Tensor:
        if self.coord_axes is not None:
            coords = coords[..., list(self.coord_axes)]
        if self.coords_transform is not None:
            coords = self.coords_transform(coords)
        return coords

    def tables(self, coords: torch.Tensor, dtype: torch.dtype) -> LayerTables:
        """One table per encoding for activations of ``dtype``; counts the ones newly built."""
        coords = self.encoding_coords(coords)
        return LayerTables([self.counted(pe.table(coords, dtype, coords.device)) for pe in self.encodings])

    def count_forward(self) -> None:
        """One more forward in ``forwards``; not counted while ``torch.compile`` traces (dynamo guards on an integer
        attribute it sees mutated, so every call of a compiled model would compile again)."""
        if not torch.compiler.is_compiling():
            self.forwards += 1

    def counted(self, table):
        """``table``, counted in ``table_builds`` the first time this seam sees it (a cache hit is not a build);
        not counted while ``torch.compile`` traces (the set would hold an object made inside the graph)."""
        if not torch.compiler.is_compiling() and table not in self._seen_tables:
            self._seen_tables.add(table)
            self.table_builds += 1
        return table

    def native_cos_sin(self, coords: torch.Tensor, out_dtype: torch.dtype, device: torch.device):
        """The stock ``(cos, sin)`` ``[L, D]`` on ``device``: fp64 phases and cos/sin (on ``coords``' device),
        rounded to fp32 and then to ``out_dtype``, as the stock modules do. Cached per table in eager mode only
        (a compiled graph recomputes it; dynamo would guard on the cache and compile again at every call)."""
        table_dtype = torch.float64 if device_has_fp64(coords.device) else torch.float32
        (table,) = self.tables(coords, table_dtype)
        compiling = torch.compiler.is_compiling()
        key = (out_dtype, torch.device(device))
        cached = self._native_cache
        if not compiling and cached is not None and cached[0]() is table and cached[1] == key:
            return cached[2]
        cos_sin = tuple(t.repeat_interleave(2, dim=-1).float().to(device, out_dtype) for t in (table.cos, table.sin))
        if not compiling:
            self._native_cache = (weakref.ref(table), key, cos_sin)
        return cos_sin

    def memo(self, key, build: Callable):
        """``build()``, reused while ``key`` (what the output depends on besides the encodings: the call's
        arguments by :func:`identity_key`, the device, the dtype, this rank's rows) and the encodings' state stay
        the same: a sampling run's steps get the first step's output without rebuilding coordinates or checking
        them again. Built afresh while ``torch.compile`` traces, and for an encoding with a schedule (its spectrum
        follows the step) or with parameters (learned: their values would have to be compared at every call)."""
        state = self._memo_state()
        if state is None:
            return build()
        full = (key, state)
        for seen, out in self._memo:
            if seen == full:
                return out
        out = build()
        self._memo = [(full, out)] + self._memo[:3]
        return out

    def _memo_state(self):
        """What the outputs depend on besides the call: the coordinate transform and axes, inference mode and each
        encoding's spectrum (by identity); ``None``: not memoised."""
        if torch.compiler.is_compiling():
            return None
        spectra = []
        for encoding in self.encodings:
            if getattr(encoding, "schedule", None) is not None or next(encoding.parameters(), None) is not None:
                return None
            spectra.append(ByIdentity(getattr(encoding, "spectrum", None)))
        transform = ByIdentity(self.coords_transform)
        return transform, self.coord_axes, self.native, torch.is_inference_mode_enabled(), tuple(spectra)

    def run_dtype(self, fallback: torch.dtype, device: torch.device) -> torch.dtype:
        """The dtype q and k will have: autocast's, else the activations'."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.activation_dtype or fallback

    def extra_repr(self) -> str:
        return f"native={self.native}, coord_axes={self.coord_axes}"


class _Same:
    """A tensor compared by identity and version (a cache key that keeps the tensor alive). Views of the same
    memory with the same layout are the same (a context-parallel plan hands the seam a new view of the caller's
    ids at every step; views share their base's version counter)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor, self.version = tensor, tensor._version

    def __eq__(self, other):
        if not isinstance(other, _Same) or other.version != self.version:
            return False
        a, b = self.tensor, other.tensor
        return a is b or (a.numel() > 0 and _layout(a) == _layout(b))

    __hash__ = None


class ByIdentity:
    """An object compared by identity (kept alive by the key, so its id is not reused)."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, ByIdentity) and other.value is self.value

    __hash__ = None


def _layout(tensor: torch.Tensor) -> tuple:
    storage = tensor.untyped_storage()  # kept alive by the key: no other live tensor has its address
    return storage.data_ptr(), tensor.storage_offset(), tensor.shape, tensor.stride(), tensor.dtype, tensor.device


class _Values:
    """A CPU tensor compared by value: a copy of it, equal to a tensor of the same dtype, shape and values (what
    the model rebuilds every forward from the same inputs: position ids)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor.detach().clone()

    def __eq__(self, other):
        if not isinstance(other, _Values):
            return False
        a, b = self.tensor, other.tensor
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)

    __hash__ = None


def values_key(value):
    """A cache key of ``value``: CPU tensors by value (a copy is kept), tensors elsewhere by identity and version
    (:func:`identity_key`: comparing values there would be a device sync per forward), lists and tuples item by
    item, other values as they are."""
    if isinstance(value, torch.Tensor):
        return _Values(value) if value.device.type == "cpu" else _Same(value)
    if isinstance(value, (list, tuple)):
        return type(value)(values_key(v) for v in value)
    return value


def identity_key(value):
    if isinstance(value, torch.Tensor):
        return _Same(value)
    if isinstance(value, (list, tuple)):
        return type(value)(identity_key(v) for v in value)
    return value
