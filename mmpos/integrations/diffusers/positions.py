"""The seam: modules that replace a diffusers transformer's position module (Flux ``pos_embed``, Wan ``rope``).

The model calls its position module once per forward and hands the result to every attention layer, so
tables built here are built once per forward, never per layer; each encoding's table cache then makes
equal coordinates (every step of a sampling run) reuse the same table.

What the seam returns is what the processors of :mod:`.processors` expect:

* native (``pe="native"``): the stock format, ``(cos, sin)`` repeated per channel (Flux ``[S, D]``,
  Wan ``[1, L, 1, D]``), with values equal bit for bit to the stock module's;
* an mmpos encoding on Flux: a :class:`LayerTables` tuple (one table per encoding);
* an mmpos encoding on Wan: ``(packed_tables, coords)``, two 4-D tensors with the sequence on dim 1 (the layout
  of Wan's context-parallel plan, which splits the position module's outputs ``0`` and ``1`` along dim 1).

Under Wan's context-parallel plan the seam builds only this rank's rows (:mod:`.context_parallel`).
"""

from __future__ import annotations

import weakref
from typing import Callable, Sequence

import torch
from torch import nn

from ..._per_thread import PerThread
from ...coords.grids import grid_rows, video_grid
from ...ops.tables import KeyedCache, RotaryTable, device_has_fp64, library_owned
from . import context_parallel


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
        forwards: forward calls so far.
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

    def counted(self, table):
        """``table``, counted in ``table_builds`` the first time this seam sees it (a cache hit is not a build);
        not counted while ``torch.compile`` traces (the set would hold an object made inside the graph)."""
        if not torch.compiler.is_compiling() and table not in self._seen_tables:
            self._seen_tables.add(table)
            self.table_builds += 1
        return table

    def native_cos_sin(self, coords: torch.Tensor, out_dtype: torch.dtype, device: torch.device):
        """The stock ``(cos, sin)`` ``[L, D]`` on ``device``: fp64 phases and cos/sin (on ``coords``' device),
        rounded to fp32 and then to ``out_dtype``, as the stock modules do."""
        table_dtype = torch.float64 if device_has_fp64(coords.device) else torch.float32
        (table,) = self.tables(coords, table_dtype)
        key = (out_dtype, torch.device(device))
        cached = self._native_cache
        if cached is not None and cached[0]() is table and cached[1] == key:
            return cached[2]
        cos_sin = tuple(t.repeat_interleave(2, dim=-1).float().to(device, out_dtype) for t in (table.cos, table.sin))
        self._native_cache = (weakref.ref(table), key, cos_sin)
        return cos_sin

    def run_dtype(self, fallback: torch.dtype, device: torch.device) -> torch.dtype:
        """The dtype q and k will have: autocast's, else the activations'."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.activation_dtype or fallback

    def extra_repr(self) -> str:
        return f"native={self.native}, coord_axes={self.coord_axes}"


class FluxPositions(PositionSeam):
    """Replaces ``FluxTransformer2DModel.pos_embed``: ``ids [S, 3]`` (text then image) -> tables.

    ``ids_precision`` checks the forward's 16-bit ids once per ids tensor (the family's input check)."""

    def __init__(self, encodings, native, coord_axes):
        super().__init__(encodings, native, coord_axes)
        self.ids_precision = IdsPrecisionCheck()

    def forward(self, ids: torch.Tensor):
        self.forwards += 1
        coords = flux_coords(ids)
        if not self.encodings:
            return None
        if self.native:
            return self.native_cos_sin(coords, torch.float32, coords.device)
        return self.tables(coords, self.run_dtype(torch.float32, coords.device))


class WanPositions(PositionSeam):
    """Replaces ``WanTransformer3DModel.rope``: latents ``[B, C, F, H, W]`` -> tables of the patch grid.

    ``native_dtype`` follows the model's casts like the stock module's fp32 buffers do (``_keep_in_fp32_modules``
    keeps it fp32 under ``from_pretrained(torch_dtype=...)``; ``model.to(torch.bfloat16)`` makes it bf16).
    """

    def __init__(self, encodings, native, coord_axes, patch_size, native_dtype=torch.float32):
        super().__init__(encodings, native, coord_axes)
        self.patch_size = tuple(int(p) for p in patch_size)
        self.register_buffer("native_dtype_probe", torch.zeros((), dtype=native_dtype), persistent=False)
        self._grid_cache = KeyedCache(max_entries=4)

    def grid_coords(self, grid: tuple[int, int, int], device, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """``video_grid`` coordinates (``rows``: only rows ``start:stop``), the same tensor while the grid, rows and
        device stay (table cache hits by identity: no value comparison, no device sync per step)."""
        key = (grid, rows, torch.device(device), torch.is_inference_mode_enabled())
        return self._grid_cache.get(key, lambda: library_owned(self.fresh_coords(grid, rows, device)))

    @staticmethod
    def fresh_coords(grid: tuple[int, int, int], rows: tuple[int, int] | None, device=None) -> torch.Tensor:
        """The grid's coordinates, or rows ``start:stop`` of them (built without the others)."""
        return video_grid(*grid, device=device) if rows is None else grid_rows(grid, *rows, device=device)

    def own_rows(self, grid: tuple[int, int, int]) -> tuple[int, int] | None:
        """This rank's rows of the grid under Wan's context-parallel plan (the seam splits its outputs itself),
        ``None`` in one process."""
        hook = context_parallel.own_output_split(self, "rope")
        return None if hook is None else context_parallel.own_rows(hook, grid[0] * grid[1] * grid[2])

    def grid(self, latents: torch.Tensor) -> tuple[int, int, int]:
        if latents.dim() != 5:
            raise ValueError(f"hidden_states has shape {tuple(latents.shape)}; expected [B, C, F, H, W]")
        sizes = tuple(latents.shape[2:])
        if any(n % p for n, p in zip(sizes, self.patch_size)):
            raise ValueError(
                f"hidden_states has (frames, height, width) = {sizes}, not divisible by the patch "
                f"size {self.patch_size}; the stock model would silently drop the remainder"
            )
        return tuple(n // p for n, p in zip(sizes, self.patch_size))

    def forward(self, hidden_states: torch.Tensor):
        self.forwards += 1
        grid = self.grid(hidden_states)
        if not self.encodings:
            return None
        rows = self.own_rows(grid)
        if self.native:  # the stock module computes its tables on the CPU at init: so do we, then cache
            cos, sin = self.native_cos_sin(
                self.fresh_coords(grid, rows), self.native_dtype_probe.dtype, hidden_states.device
            )
            return cos[None, :, None], sin[None, :, None]
        coords = self.grid_coords(grid, hidden_states.device, rows)
        tables = self.tables(coords, self.run_dtype(hidden_states.dtype, hidden_states.device))
        if not all(isinstance(t, RotaryTable) for t in tables):
            return tables  # not packed (a LayerTables tuple): under context parallelism already this rank's rows
        return pack_tables(tables), coords[None, :, None]

    def global_coords(self, args, kwargs) -> torch.Tensor:
        """The whole grid's coordinates (what scheduled encodings measure their extents on), built afresh: under
        context parallelism no rank keeps them."""
        hidden_states = kwargs.get("hidden_states", args[0] if args else None)
        return video_grid(*self.grid(hidden_states), device=hidden_states.device)


def flux_coords(ids: torch.Tensor) -> torch.Tensor:
    """Flux ids ``[S, A]`` as fp32 coordinates, as the stock ``FluxPosEmbed`` reads them."""
    if ids.dim() != 2:
        raise ValueError(f"ids have shape {tuple(ids.shape)}; expected [S, num_axes]")
    return ids.float()


class IdsPrecisionCheck:
    """Refuse 16-bit ids that lost positions (bf16 holds integers exactly only up to 256, fp16 up to 2048).

    Reading the maximum synchronises with the device, so each ids tensor is checked once: pipelines pass the
    same ids object at every step.
    """

    def __init__(self):
        self._checked: dict[str, tuple] = {}

    def __call__(self, name: str, ids: torch.Tensor) -> None:
        if ids.dtype not in (torch.float16, torch.bfloat16):
            return
        seen = self._checked.get(name)
        if seen is not None and seen[0]() is ids and seen[1] == ids._version:
            return
        exact = 256 if ids.dtype == torch.bfloat16 else 2048
        if ids.numel() and ids.abs().max().item() > exact:
            raise ValueError(
                f"{name} is {ids.dtype} with positions above {exact}, which that dtype rounds; build the ids in float32"
            )
        self._checked[name] = (weakref.ref(ids), ids._version)
