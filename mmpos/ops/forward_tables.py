"""Tables of one forward: the model builds them before its blocks run; attention only applies them.

As in timm's Eva (``rope`` built in ``_pos_embed``, handed to every block) and diffusers' position modules:
the coordinates are checked once per forward and each distinct encoding builds its table once per forward,
instead of every attention layer calling ``pe(q, k, coords)`` (a finiteness check, a host sync on CUDA, and a
cache lookup per layer). Encodings are used through their public methods only: ``table`` and ``rotate_qk``.

    tables = ForwardTables([block.pe for block in blocks], coords, run_dtype, device)   # once per forward
    q, k = pe.rotate_qk(q, k, tables.get(pe, q))                                       # in each attention

Encodings named ``in_block`` (a block's own learned encoding) build their table inside ``get``, i.e. in their
block's forward: where FSDP2 (``fully_shard`` per block) or ZeRO-3 has gathered the block's parameters, and where
activation checkpointing recomputes it. The values are the same as a table built up front.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Protocol, Sequence

import torch

from .rotation import compute_dtype
from .tables import check_coords, finite_checked


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
        in_block: encodings among ``encodings`` whose table ``get`` builds when their block asks for it (not
            kept: a block's own learned encoding, whose parameters a sharded model gathers only in that block).
    """

    def __init__(
        self,
        encodings: Sequence[BuildsTables],
        coords: torch.Tensor,
        dtype: torch.dtype,
        device: torch.device | str,
        in_block: Sequence[BuildsTables] = (),
    ) -> None:
        self.coords, self.dtype, self.device = coords, dtype, torch.device(device)
        self.compute_dtype = compute_dtype(dtype, self.device)
        deferred = {id(pe) for pe in in_block}
        distinct = [pe for key, pe in {id(pe): pe for pe in encodings}.items() if key not in deferred]
        self._tables: dict[int, Any] = {}
        self._checked = bool(distinct or deferred)
        if distinct:  # the first table checks the coordinates; the others trust that check
            self._tables[id(distinct[0])] = distinct[0].table(coords, dtype, self.device)
        elif deferred:  # every table is built in its block: check the coordinates here, once
            check_coords(coords, coords.shape[-1] if coords.dim() > 1 else 1)
        with finite_checked(coords):
            for pe in distinct[1:]:
                self._tables[id(pe)] = pe.table(coords, dtype, self.device)

    def __len__(self) -> int:
        return len(self._tables)

    def get(self, pe: BuildsTables, q: torch.Tensor) -> Any:
        """``pe``'s table for ``q``: the one built up front, or an ``in_block`` encoding's, built now at the
        forward's dtype; a ``q`` of a precision or device this forward did not foresee (e.g. fp32 after qk-norm
        under CPU autocast) gets a table of its own, as the per-layer path would build."""
        foreseen = q.device == self.device and compute_dtype(q.dtype, q.device) == self.compute_dtype
        table = self._tables.get(id(pe))
        if table is not None and foreseen:
            return table
        with finite_checked(self.coords) if self._checked else nullcontext():  # checked in __init__
            return pe.table(self.coords, self.dtype if foreseen else q.dtype, q.device)
