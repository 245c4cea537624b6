"""PE transplant's position rewrite on any family with an edit adapter (FLUX.1 Fill, FLUX.2 Klein, Qwen-Image).

:func:`mmpos.coords.edits.transplant_ids` gives FLUX.1-style ``(index, row, col)`` ids per canvas token; the
family's edit adapter (:mod:`mmpos.pipelines.edits.families`) puts them in its coordinates (``grid_coords``) and
moves the tokens there, run by the :class:`~mmpos.pipelines.edits.context.EditSession` while ``sigma >= tau``:

* FLUX.1 Fill: ``img_ids`` are the canvas grid's, replaced whole before the forward.
* FLUX.2: ``(t, h, w, l) = (0, row, col, 0)``; the canvas is the output image (``t = 0``); the pipeline also
  appends the encoded canvas (``t = 10``) and an optional ``image_reference`` (``t = 20``), which keep their
  native ids. The ``t = 0`` rows of ``img_ids`` are rewritten, found by their coordinates, not their place.
* Qwen-Image: ``(frame, row - (h - h // 2), col - (w - w // 2))``; the model has no ids argument, so the
  session's forward hook on its position module replaces the moved tokens' rows of the image table with the
  table at their new coordinates, built with the module's own frequencies (stock, or ``set_pe``'s).

Below ``tau`` and with the transplant off every table is the model's own, bit for bit.
"""

from __future__ import annotations

import torch

from mmpos.coords.grids import flux_ids

from ..context import EditContext


class TransplantPositions:
    """An :class:`~mmpos.pipelines.edits.context.EditContext` rewriter: while ``sigma >= tau`` the canvas tokens
    take the transplanted ``ids [rows * cols, 3]`` (FLUX.1-style, on the ``grid``), in the family's coordinates."""

    def __init__(self, ids: torch.Tensor, grid: tuple[int, int], tau: float):
        self.ids, self.grid, self.tau = ids, tuple(grid), tau
        self.moved = (ids != flux_ids(*grid, device=ids.device)).any(-1)  # [rows * cols] bool: cells that move
        self.cache: dict = {}  # the adapter's tables kept across forwards
        self._coords: dict = {}  # family -> the ids in its coordinates

    def coords(self, adapter) -> torch.Tensor:
        """The transplanted ids in ``adapter``'s family's coordinates ``[rows * cols, A]``."""
        if adapter.family not in self._coords:
            self._coords[adapter.family] = adapter.grid_coords(self.ids, self.grid)
        return self._coords[adapter.family]

    def active(self, context) -> bool:
        return context.sigma is not None and context.sigma >= self.tau

    def __call__(self, context, kwargs: dict) -> dict:
        if not self.active(context):
            return kwargs
        return context.adapter.move_ids(kwargs, self.coords(context.adapter), self.grid)

    def on_positions(self, context, module, args, kwargs, output):
        if not self.active(context):
            return None
        adapter = context.adapter
        return adapter.move_table(module, args, kwargs, output, self.coords(adapter), self.moved, self.grid, self.cache)


def transplant_context(ids: torch.Tensor, grid: tuple[int, int], config) -> EditContext:
    """The edit context of one transplant call (``config``: a ``TransplantConfig``; off: no rewriter)."""
    context = EditContext(enabled=config.enabled)
    if config.enabled:
        context.rewriters.append(TransplantPositions(ids, grid, config.tau))
    return context
