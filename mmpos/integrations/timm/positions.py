"""Where a converted timm ViT's tokens sit, and the tables of each forward.

One object, the model's :class:`TokenPositions` (``model.mmpos_positions``), owns a forward's positional data;
it goes through four steps, in the order timm's ``forward_features`` / ``forward_intermediates`` runs them:

1. **start** -- the patch embedding's forward hook (:class:`ConvGridHook` on its projection, :class:`PatchGridHook`,
   :class:`NaFlexEmbedsHook`) calls
   :meth:`TokenPositions.start` with the patch grid (static size, ``dynamic_img_size``) or NaFlex ``patch_coord``:
   a new :class:`ForwardState` for the calling thread;
2. **keep** -- the model's PatchDropout, replaced by :class:`PositionalPatchDropout` (same randomness, same
   outputs), calls :meth:`TokenPositions.keep` with the patch tokens each sample kept;
3. **prepare** -- right before the blocks, ``norm_pre``'s forward pre-hook checks the coordinates once and
   either builds one table per distinct shared rotary encoding (:class:`BlockTablesHook`, as timm's Eva builds
   its rope in ``_pos_embed``; a block's own learned encoding builds its table in that block's attention, where
   FSDP2 / ZeRO-3 gathered the block's parameters and where activation checkpointing recomputes it) or adds the
   absolute encoding to the patch tokens (:class:`AddAbsoluteHook`);
4. **apply** -- every converted attention block takes its encoding's table (:meth:`TokenPositions.table`) and
   only applies it (prefix tokens, i.e. cls and registers, get no coordinates and stay unrotated).

The hooks of steps 1 and 3 are :class:`ForwardStep` objects (what ``restore`` removes). Steps 1 to 3 cannot hand
their results to the attention modules as arguments: timm's blocks call ``attn(x, attn_mask=...)`` only. So
the results go through the model's :class:`TokenPositions`, in a :class:`ForwardState` of the calling thread
(:class:`~mmpos._per_thread.PerThread`), never on the shared module: one model serves several threads with
different image sizes. Coordinates of recent grids are reused across forwards (the same tensor object), so
encodings' table caches hit by identity.
"""

from __future__ import annotations

import threading
from typing import Sequence

import torch
from timm.layers import PatchDropout, register_notrace_module
from timm.layers.patch_dropout import PatchDropoutWithIndices, patch_dropout_forward
from torch import nn

from ..._per_thread import PerThread
from ..._validation import check_choice
from ...coords.grids import MODES, image_grid
from ...encodings.absolute import LearnedAPE
from ...ops.forward_tables import ForwardTables, run_dtype
from ...ops.tables import KeyedCache, library_owned


class ForwardState:
    """What one forward knows about its tokens: a ``grid`` or per-sample ``patch_coord``, PatchDropout's
    ``keep_indices``, then the ``coords`` of the patch tokens and the ``tables`` of its blocks."""

    def __init__(self, grid: tuple[int, int] | None = None, patch_coord: torch.Tensor | None = None):
        self.grid, self.patch_coord = grid, patch_coord
        self.keep_indices: torch.Tensor | None = None
        self.coords: torch.Tensor | None = None
        self.tables: ForwardTables | None = None
        self.table_tokens: int | None = None  # the token count the tables were built for


class TokenPositions:
    """(row, col) coordinates of the patch tokens of the current forward, and its tables.

    Args:
        num_prefix_tokens: leading tokens without coordinates (cls, registers).
        grid_mode, grid_scale: how patch indices become coordinates (see :func:`mmpos.coords.image_grid`):
            ``"index"`` (0 .. n-1, rope-vit and timm), ``"centered"`` or ``"normalized"`` ((i + .5) / n).
        grid_indexing: ``"ij"`` gives (row, col) coordinates, ``"xy"`` gives (col, row) (timm's option of the
            same name: which axis the encoding's first channels read).
    """

    def __init__(
        self, num_prefix_tokens: int, grid_mode: str = "index", grid_scale: float = 1.0, grid_indexing: str = "ij"
    ):
        check_choice("grid_mode", grid_mode, MODES)
        check_choice("grid_indexing", grid_indexing, ("ij", "xy"))
        self.num_prefix_tokens, self.grid_mode, self.grid_scale = num_prefix_tokens, grid_mode, grid_scale
        self.grid_indexing = grid_indexing
        self._init_runtime()

    def _init_runtime(self) -> None:
        # coordinates of recent grids, reused across forwards: table caches then hit by identity (no value
        # comparison, so no device sync per step)
        self._grid_cache = KeyedCache(max_entries=4)
        self._grid_lock = threading.Lock()
        self._forward = PerThread(ForwardState())  # this thread's forward (step 1 starts one)

    def __getstate__(self):  # copy.deepcopy (EMA) and pickling keep the settings, not forwards in flight
        return {k: v for k, v in self.__dict__.items() if k not in ("_grid_cache", "_grid_lock", "_forward")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_runtime()

    @property
    def current(self) -> ForwardState:
        """This thread's latest forward; in a thread that ran none (autograd's, recomputing a checkpointed block
        on a GPU), the latest forward of any thread."""
        return self._forward.get()

    @property
    def grid(self) -> tuple[int, int] | None:
        return self.current.grid

    @property
    def patch_coord(self) -> torch.Tensor | None:
        return self.current.patch_coord

    @property
    def keep_indices(self) -> torch.Tensor | None:
        return self.current.keep_indices

    def start(self, grid: tuple[int, int] | None = None, patch_coord: torch.Tensor | None = None) -> None:
        """Step 1, a new forward: tokens on a ``grid`` (row-major) or at per-sample ``patch_coord`` ``[B, N, 2]``."""
        self._forward.set(ForwardState(None if grid is None else (int(grid[0]), int(grid[1])), patch_coord))

    def keep(self, keep_indices: torch.Tensor | None) -> None:
        """Step 2: PatchDropout kept patch tokens ``keep_indices`` ``[B, K]`` (indices among patch tokens)."""
        state = self.current
        state.keep_indices, state.coords, state.tables = keep_indices, None, None

    def coords(self, num_tokens: int, device: torch.device) -> torch.Tensor:
        """``[L, 2]`` (or ``[B, L, 2]`` after PatchDropout / in NaFlex mode) float32 coordinates of the
        ``L = num_tokens - num_prefix_tokens`` patch tokens."""
        state = self.current
        if state.coords is None or state.coords.device != torch.device(device):
            state.coords = self._build(state, device)
        expected = num_tokens - self.num_prefix_tokens
        if state.coords.shape[-2] != expected:
            where = f"a {state.grid[0]}x{state.grid[1]} patch grid" if state.grid else "patch_coord"
            raise ValueError(
                f"{where} gives {state.coords.shape[-2]} patch tokens but attention sees {num_tokens} "
                f"tokens with {self.num_prefix_tokens} prefix token(s), i.e. {expected}"
            )
        return state.coords

    def build_tables(
        self,
        encodings: Sequence[nn.Module],
        num_tokens: int,
        dtype: torch.dtype,
        device,
        in_block: Sequence[nn.Module] = (),
    ) -> None:
        """Step 3, this forward's tables for its blocks' ``encodings`` (coordinates checked once, one table each;
        those of ``in_block`` encodings are built when their block asks, see :class:`ForwardTables`)."""
        state = self.current
        state.tables = ForwardTables(encodings, self.coords(num_tokens, device), dtype, device, in_block)
        state.table_tokens = num_tokens

    def table(self, pe: nn.Module, num_tokens: int, q: torch.Tensor):
        """Step 4: ``pe``'s table for a block's ``q`` ``[B, H, N, D]`` of ``num_tokens`` tokens: the one built for
        this forward, or, for an attention module called on its own, a table built from this forward's
        coordinates."""
        state = self.current
        if state.tables is None or state.table_tokens != num_tokens:
            return pe.table(self.coords(num_tokens, q.device), q.dtype, q.device)
        return state.tables.get(pe, q)

    def _grid_coords(self, grid, device) -> torch.Tensor:
        if torch.compiler.is_compiling():  # traced into the graph (no cache lookups, locks or mode queries)
            return self._grid_from_options(grid, device)
        key = (
            grid,
            torch.device(device),
            self.grid_mode,
            self.grid_scale,
            self.grid_indexing,
            torch.is_inference_mode_enabled(),
        )

        with self._grid_lock:
            return self._grid_cache.get(key, lambda: self._grid_from_options(grid, device))

    def _grid_from_options(self, grid, device) -> torch.Tensor:
        coords = image_grid(*grid, mode=self.grid_mode, scale=self.grid_scale, device=device)
        return library_owned(coords.flip(-1) if self.grid_indexing == "xy" else coords)

    def _build(self, state: ForwardState, device) -> torch.Tensor:
        if state.patch_coord is not None:
            coords = state.patch_coord.to(device, torch.float32) * self.grid_scale
        elif state.grid is not None:
            coords = self._grid_coords(state.grid, device)
        else:
            raise RuntimeError(
                "no patch grid was recorded for this forward: the converted model's patch "
                "embedding did not run (call the model, forward_features or forward_intermediates)"
            )
        if self.grid_indexing == "xy" and state.patch_coord is not None:
            coords = coords.flip(-1)
        if state.keep_indices is not None:
            keep = state.keep_indices.to(device)
            if coords.dim() == 2:
                coords = coords[keep]  # [B, K, 2]
            else:
                coords = coords.gather(1, keep.unsqueeze(-1).expand(-1, -1, coords.shape[-1]))
        return coords


class ForwardStep:
    """An mmpos hook on a converted timm model, one step of the forward (see the module docstring): a small
    object holding the model's :class:`TokenPositions`, not a closure, so that ``copy.deepcopy(model)`` (EMA)
    rewires it to the copy's positions and encodings; :func:`~.restore.restore` removes every one."""

    positions: TokenPositions


class BlockTablesHook(ForwardStep):
    """Step 3 (rotary), forward pre-hook for ``norm_pre`` (the last module before the blocks, outside any
    checkpointed block):
    check the coordinates and build this forward's tables for the blocks' shared ``encodings``; an encoding
    with parameters that only one block uses builds its table in that block (FSDP2 / ZeRO-3 shard it with the
    block and gather it for the block's forward only). An object, not a closure, so that ``copy.deepcopy(model)``
    rewires it to the copy's encodings and positions."""

    def __init__(self, positions: TokenPositions, encodings: Sequence[nn.Module]):
        self.positions, self.encodings = positions, list(encodings)
        self.in_block = block_owned(self.encodings)

    def __call__(self, module, args):
        x = args[0]
        if isinstance(x, torch.fx.Proxy):  # torch.fx tracing: each (leaf) attention builds its table at run time
            return
        self.positions.build_tables(self.encodings, x.shape[1], run_dtype(x), x.device, getattr(self, "in_block", ()))


def block_owned(encodings: Sequence[nn.Module]) -> list[nn.Module]:
    """The ``encodings`` (one per block) that have parameters and belong to one block only."""
    uses: dict[int, int] = {}
    for pe in encodings:
        uses[id(pe)] = uses.get(id(pe), 0) + 1
    return [pe for pe in encodings if uses[id(pe)] == 1 and any(True for _ in pe.parameters())]


class PatchGridHook(ForwardStep):
    """Step 1, forward hook for a timm ``PatchEmbed``: record the grid of the image it just embedded."""

    def __init__(self, positions: TokenPositions):
        self.positions = positions

    def __call__(self, module, args, output):
        if output.dim() == 4:  # NHWC: dynamic_img_size
            grid = output.shape[1:3]
        elif hasattr(module, "dynamic_feat_size"):
            grid = module.dynamic_feat_size(tuple(args[0].shape[-2:]))
        else:
            grid = module.grid_size
        self.positions.start(grid=grid)


class ConvGridHook(PatchGridHook):
    """Step 1, forward hook for the patch embedding's projection ``Conv2d`` (``patch_embed.proj``): its output
    ``[B, C, H, W]`` is the patch grid, whatever the image size or padding. A ``torch.nn`` leaf under torch.fx, so
    this hook also runs in a traced model (a hook on timm's ``PatchEmbed`` would run once, at trace time)."""

    def __call__(self, module, args, output):
        self.positions.start(grid=output.shape[-2:])


class NaFlexEmbedsHook(PatchGridHook):
    """Step 1, forward hook (with kwargs) for NaFlexVit's ``embeds``: the grid, or per-token ``patch_coord``."""

    def __call__(self, module, args, kwargs, output):
        patch_coord = kwargs.get("patch_coord", args[1] if len(args) > 1 else None)
        if patch_coord is not None:
            self.positions.start(patch_coord=patch_coord)
        else:
            self.positions.start(grid=output[1])


class PositionalPatchDropout(nn.Module):
    """Step 2: timm's PatchDropout (the model's ``patch_drop``, which it replaces) that also tells ``positions``
    which patch tokens it kept: same options, same randomness, same output type (with indices for timm's
    ``PatchDropoutWithIndices``)."""

    def __init__(self, original: nn.Module, positions: TokenPositions):
        super().__init__()
        if not isinstance(original, (PatchDropout, PatchDropoutWithIndices)):
            raise TypeError(f"cannot track keep indices of {type(original).__name__}; expected timm PatchDropout")
        self.prob, self.num_prefix_tokens, self.ordered = original.prob, original.num_prefix_tokens, original.ordered
        self.returns_indices = isinstance(original, PatchDropoutWithIndices)
        self.positions = positions

    def forward(self, x):
        out, keep = patch_dropout_forward(x, self.prob, self.num_prefix_tokens, self.ordered, self.training)
        self.positions.keep(keep)
        return (out, keep) if self.returns_indices else out

    def extra_repr(self):
        return f"prob={self.prob}, num_prefix_tokens={self.num_prefix_tokens}, returns_indices={self.returns_indices}"


register_notrace_module(PositionalPatchDropout)  # torch.fx: runs at run time, so it reports the kept tokens then


class AddAbsoluteHook(ForwardStep):
    """Step 3 (absolute), forward pre-hook for ``norm_pre``: add the absolute encoding to the patch tokens, at
    this forward's coordinates."""

    def __init__(self, ape, positions):
        self.ape, self.positions = ape, positions

    def __call__(self, module, args):
        x = args[0]
        if isinstance(x, torch.fx.Proxy):  # torch.fx tracing: the addition, at this forward's coordinates, is a node
            tracer = x.tracer
            ape, positions = (
                tracer.create_proxy("get_attr", name, (), {}) for name in ("mmpos_ape", "mmpos_positions")
            )
            return (tracer.create_proxy("call_function", add_absolute, (x, ape, positions), {}),)
        return (add_absolute(x, self.ape, self.positions),)


def add_absolute(x: torch.Tensor, ape: nn.Module, positions: TokenPositions) -> torch.Tensor:
    """``x`` ``[B, N, C]`` with ``ape``'s embedding of this forward's coordinates added to its patch tokens."""
    coords = positions.coords(x.shape[1], x.device)
    n = ape.num_prefix_tokens
    embedding = _absolute_embedding(ape, positions, coords).to(x.dtype)
    return torch.cat([x[:, :n], x[:, n:] + embedding], dim=1)


def _absolute_embedding(ape, positions, coords):
    """Embedding of the patch tokens; a learned table is resampled to a grid other than its own."""
    if not isinstance(ape, LearnedAPE) or positions.grid is None or positions.grid == ape.grid_size:
        return ape.embed(coords)
    if positions.grid_mode != "index" or positions.grid_scale != 1.0:
        raise ValueError("ape_learned on another grid resamples its table; use grid_mode='index', grid_scale=1")
    table = ape.resample(positions.grid)  # [H * W, C]
    if positions.keep_indices is None:
        return table
    return table[positions.keep_indices.to(table.device)]
