"""PE transplant on FLUX.2 Klein and Qwen-Image inpainting: the canvas's transplanted positions in each family's
coordinates, and the hooks that switch them by noise level.

The canvas and its transplant are those of FLUX.1 Fill (:mod:`.canvas`): :func:`mmpos.coords.edits.
transplant_ids` gives ``(index, row, col)`` per canvas token; here they become the family's coordinates:

* FLUX.2: ``(t, h, w, l) = (0, row, col, 0)``; the canvas is the output image (``t = 0``); the pipeline also
  appends the encoded canvas (``t = 10``) and an optional ``image_reference`` (``t = 20``) as condition tokens,
  which keep their native ids. A pre-forward hook rewrites the ``t = 0`` rows of ``img_ids``, found by their
  coordinates (``(h, w)`` -> canvas cell), not by their place in the sequence.
* Qwen-Image: ``(frame, row - (h - h // 2), col - (w - w // 2))`` (rows and columns centred on the image, as
  ``QwenEmbedRope`` places them); the model has no ids argument, so a forward hook on its position module
  replaces the transplanted tokens' rows of the image table with the table at their new coordinates, built with
  the module's own frequencies (the stock ladder, or the ``set_pe`` encoding's spectrum).

Both are active while ``sigma >= tau`` (sigma read from the forward's timestep by the family); below ``tau`` and
with the transplant off every table is the model's own, bit for bit.
"""

from __future__ import annotations

from typing import Optional

import torch

from mmpos.integrations.diffusers.families import get_family
from mmpos.integrations.diffusers.families.qwen import qwen_coords

from ..families.qwen import qwen_table_at
from ..pipeline import this_thread_only


def flux2_canvas_ids(ids: torch.Tensor) -> torch.Tensor:
    """FLUX.1-style canvas ids ``[N, 3]`` ``(0, row, col)`` -> FLUX.2 ``[N, 4]`` ``(0, row, col, 0)`` (fp32)."""
    out = torch.zeros(ids.shape[0], 4, dtype=torch.float32, device=ids.device)
    out[:, 1:3] = ids[:, 1:3].float()
    return out


def qwen_canvas_coords(ids: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """FLUX.1-style canvas ids ``[N, 3]`` on a ``rows x cols`` grid -> Qwen-Image's centred coordinates
    ``[N, 3]`` ``(0, row - (rows - rows // 2), col - (cols - cols // 2))`` (fp32)."""
    rows, cols = grid
    out = torch.zeros(ids.shape[0], 3, dtype=torch.float32, device=ids.device)
    out[:, 1] = ids[:, 1].float() - (rows - rows // 2)
    out[:, 2] = ids[:, 2].float() - (cols - cols // 2)
    return out


def canvas_cells(coords: torch.Tensor, grid: tuple[int, int], offset: tuple[float, float] = (0.0, 0.0)):
    """Canvas cell ``row * cols + col`` of each token whose spatial coordinates ``coords [S, 2]`` (minus
    ``offset``) are an integer cell of the ``rows x cols`` grid; an error when any is not (the pipeline's ids and
    the canvas disagree)."""
    rows, cols = grid
    r = coords[:, 0].double() - offset[0]
    c = coords[:, 1].double() - offset[1]
    if bool(((r != r.round()) | (c != c.round()) | (r < 0) | (r >= rows) | (c < 0) | (c >= cols)).any()):
        raise ValueError(
            f"the canvas tokens' coordinates do not form the {rows}x{cols} canvas grid; the canvas and "
            "the pipeline's height/width disagree"
        )
    return r.long() * cols + c.long()


class Flux2TransplantIds:
    """Pre-forward hook of a FLUX.2 transformer: while ``sigma >= tau``, the canvas tokens (``t = 0``) of
    ``img_ids [B, S, 4]`` get the transplanted ids of their canvas cell; the rewritten ids are fp32 (the
    pipelines' are int64, which would truncate the fractional positions; ``Flux2PosEmbed`` reads ``ids.float()``,
    so the untouched rows give the same tables)."""

    def __init__(self, ids: torch.Tensor, grid: tuple[int, int], tau: float):
        self.ids, self.grid, self.tau = flux2_canvas_ids(ids), grid, tau
        self.family = get_family("flux2")
        self.active_calls = 0

    def __call__(self, module, args, kwargs):
        sigma = self.family.sigma(args, kwargs)
        if sigma is None or sigma < self.tau:
            return None
        native = kwargs["img_ids"]
        flat = native[0] if native.ndim == 3 else native  # the model reads the first sample's ids (shared)
        canvas = flat[:, 0] == 0
        cells = canvas_cells(flat[canvas][:, 1:3], self.grid)
        if cells.numel() != self.grid[0] * self.grid[1]:
            raise ValueError(
                f"img_ids hold {cells.numel()} canvas tokens (t = 0); the {self.grid[0]}x{self.grid[1]} "
                "canvas has one per cell"
            )
        rewritten = flat.to(torch.float32, copy=True)  # stock ids are int64: fractional positions need fp32
        rewritten[canvas] = self.ids.to(flat.device)[cells]
        self.active_calls += 1
        if native.ndim == 3:
            rewritten = rewritten.expand(native.shape[0], -1, -1)
        return args, {**kwargs, "img_ids": rewritten}


class QwenTransplantTables:
    """Hooks of a Qwen-Image transformer: its pre-forward hook reads sigma; a forward hook on its position module
    replaces, while ``sigma >= tau``, the transplanted canvas tokens' rows of the image table."""

    def __init__(self, ids: torch.Tensor, moved: torch.Tensor, grid: tuple[int, int], tau: float):
        self.coords = qwen_canvas_coords(ids, grid)
        self.moved = moved.flatten()  # [rows * cols] bool: the canvas cells whose position changed
        self.grid, self.tau = grid, tau
        self.family = get_family("qwen")
        self.sigma: Optional[float] = None
        self.active_calls = 0
        self._cache = None  # (call key, stock image table, rewritten table): the stock module caches its tables

    def pre_forward(self, module, args, kwargs):
        self.sigma = self.family.sigma(args, kwargs)
        return None

    def on_positions(self, module, args, kwargs, output):
        if self.sigma is None or self.sigma < self.tau:
            return None
        video_fhw = kwargs.get("video_fhw", args[0] if args else None)
        image_table, text_table = output
        key = (repr(video_fhw), id(module))
        cached = self._cache
        if cached is None or cached[0] != key or cached[1] is not image_table:  # the table held: ids not reused
            tokens, new_rows = self._rows(module, video_fhw, image_table)
            out = image_table.index_copy(0, tokens, new_rows.to(image_table.dtype))
            cached = self._cache = (key, image_table, out)
        self.active_calls += 1
        return cached[2], text_table

    def _rows(self, module, video_fhw, image_table):
        """The image tokens that move (found by their coordinates) and their table rows at the new coordinates."""
        coords = qwen_coords(video_fhw, 1, image_table.device)[0]
        rows, cols = self.grid
        canvas = coords[:, 0] == 0
        cells = canvas_cells(coords[canvas][:, 1:3], self.grid, (-(rows - rows // 2), -(cols - cols // 2)))
        moved = self.moved.to(cells.device)[cells]
        tokens = canvas.nonzero().flatten()[moved]
        return tokens, qwen_table_at(module, self.coords.to(image_table.device)[cells[moved]])


class TransplantHooks:
    """Installs a family's transplant hooks on ``transformer`` for a ``with`` block (none when ``hooks`` is
    None: the transplant is off and the model runs untouched)."""

    def __init__(self, transformer, hooks):
        self.transformer, self.hooks, self._handles = transformer, hooks, []

    def __enter__(self):
        hooks, transformer = self.hooks, self.transformer
        if isinstance(hooks, Flux2TransplantIds):
            self._handles.append(transformer.register_forward_pre_hook(this_thread_only(hooks), with_kwargs=True))
        elif isinstance(hooks, QwenTransplantTables):
            self._handles.append(
                transformer.register_forward_pre_hook(this_thread_only(hooks.pre_forward), with_kwargs=True)
            )
            self._handles.append(
                transformer.pos_embed.register_forward_hook(this_thread_only(hooks.on_positions), with_kwargs=True)
            )
        elif hooks is not None:
            raise TypeError(f"unknown transplant hooks {type(hooks).__name__}")
        return hooks

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
