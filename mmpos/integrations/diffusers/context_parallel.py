"""Context parallelism: how diffusers' ``_cp_plan`` shards the sequence, and why mmpos tables stay consistent.

diffusers (``model.enable_parallelism(config=ContextParallelConfig(...))``) shards tensors named in the
model's ``_cp_plan`` along the sequence, each rank keeping chunk ``rank`` (``tensor.chunk`` when the length
divides evenly, ``tensor.tensor_split`` with ``ulysses_anything`` / ``ring_anything``):

* Flux splits ``img_ids`` and ``txt_ids`` (dim 0) with ``hidden_states`` and ``encoder_hidden_states``
  (dim 1), so the seam on rank ``r`` sees the *global* ids of its own tokens, in the order
  ``[txt shard r, img shard r]`` that its joint q/k have. Tables are built from those ids: coordinates are
  global and each table row belongs to its token by construction.
* Wan splits the position module's outputs ``0`` and ``1`` along dim 1 and ``hidden_states`` at ``blocks.0``
  along dim 1. The seam builds the full grid's tables and returns them packed as ``[b, L, G, 2P]`` with the
  coordinates ``[1, L, 1, A]``: chunking dim 1 shards tables and coordinates exactly as the tokens.

q and k are rotated on each rank before attention, so ring (K/V passed around) and Ulysses (all-to-all
over heads) attention see already-rotated keys: RoPE's relative property holds across shards.

Scheduled encodings (extrapolation presets) resolve their spectrum from the extents of the whole sequence,
measured before the plan shards the ids (:mod:`.global_extents`), never from the shard's.

Limits: coordinate transforms (``PositionSeam.coords_transform``) must use global quantities only, never
statistics of the local shard (e.g. a grid size taken from ``ids.max()``). Wan tables of encodings whose
table is not a ``RotaryTable`` cannot be packed and are rejected by the plan's output hook; Wan builds the full
grid's tables on every rank. ``tests/integrations/test_context_parallel.py`` runs Flux on 2 processes (gloo); the
single-process tests replay the sharding with :func:`shard_like_context_parallel`.
"""

from __future__ import annotations

import torch


def shard_like_context_parallel(
    x: torch.Tensor, dim: int, world_size: int, rank: int, anything: bool = False
) -> torch.Tensor:
    """Rank ``rank``'s shard of ``x`` along ``dim``, as diffusers' ``EquipartitionSharder`` (even split, the
    length must divide) or ``PartitionAnythingSharder`` (``anything=True``, ``tensor_split``) make it."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    if anything:
        if x.shape[dim] < world_size:
            raise ValueError(f"cannot split {x.shape[dim]} positions over {world_size} ranks")
        return x.tensor_split(world_size, dim=dim)[rank]
    if x.shape[dim] % world_size:
        raise ValueError(
            f"dim {dim} has {x.shape[dim]} positions, not divisible by world_size={world_size} "
            "(diffusers asserts this; use ulysses_anything/ring_anything)"
        )
    return x.chunk(world_size, dim=dim)[rank]
