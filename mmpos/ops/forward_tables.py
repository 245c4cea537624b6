"""Tables of one forward: the model builds them before its blocks run; attention only applies them.

As in timm's Eva (``rope`` built in ``_pos_embed``, handed to every block) and diffusers' position modules:
the coordinates are checked once per forward and each distinct encoding builds its table once per forward,
instead of every attention layer calling ``pe(q, k, coords)`` (a finiteness check, a host sync on CUDA, and a
cache lookup per layer). Encodings are used through their public methods only: ``table`` and ``rotate_qk``.

    tables = ForwardTables([block.pe for block in blocks], coords, run_dtype, device)   # once per forward
    q, k = pe.rotate_qk(q, k, tables.get(pe, q))                                       # in each attention
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Protocol, Sequence

import torch

from .rotation import compute_dtype
from .tables import finite_checked


class BuildsTables(Protocol):
    """What this module uses of an encoding (an ``nn.Module`` in practice)."""

    def table(self, coords: torch.Tensor, dtype: torch.dtype, device: torch.device) -> Any: ...


def run_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype q and k projected from ``x`` will have: autocast's where it is on, else ``x``'s."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


class ForwardTables:
    """One table per distinct encoding for one forward.

    Args:
        encodings: the encoding of every block (a shared encoding appears once per block; it builds one table).
        coords: ``[L, A]`` or ``[B, L, A]`` coordinates of the tokens, checked once for all encodings.
        dtype: the dtype q and k will have (see :func:`run_dtype`); only its compute precision matters.
        device: where q and k live.
    """

    def __init__(self, encodings: Sequence[BuildsTables], coords: torch.Tensor, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.coords, self.dtype, self.device = coords, dtype, torch.device(device)
        self.compute_dtype = compute_dtype(dtype, self.device)
        distinct = list({id(pe): pe for pe in encodings}.values())
        self._tables: dict[int, Any] = {}
        if distinct:  # the first table checks the coordinates; the others trust that check
            self._tables[id(distinct[0])] = distinct[0].table(coords, dtype, self.device)
        with finite_checked(coords):
            for pe in distinct[1:]:
                self._tables[id(pe)] = pe.table(coords, dtype, self.device)

    def __len__(self) -> int:
        return len(self._tables)

    def get(self, pe: BuildsTables, q: torch.Tensor) -> Any:
        """``pe``'s table for ``q``; a ``q`` of a precision or device this forward did not foresee (e.g. fp32
        after qk-norm under CPU autocast) gets a table of its own, as the per-layer path would build."""
        table = self._tables.get(id(pe))
        if table is None or q.device != self.device or compute_dtype(q.dtype, q.device) != self.compute_dtype:
            with finite_checked(self.coords) if self._tables else nullcontext():  # checked in __init__
                return pe.table(self.coords, q.dtype, q.device)
        return table
