"""Context parallelism: how diffusers' ``_cp_plan`` shards the sequence, and why mmpos tables stay consistent.

diffusers (``model.enable_parallelism(config=ContextParallelConfig(...))``) shards tensors named in the
model's ``_cp_plan`` along the sequence, each rank keeping chunk ``rank`` (``tensor.chunk`` when the length
divides evenly, ``tensor.tensor_split`` with ``ulysses_anything`` / ``ring_anything``):

* Flux splits ``img_ids`` and ``txt_ids`` (dim 0) with ``hidden_states`` and ``encoder_hidden_states``
  (dim 1), so the seam on rank ``r`` sees the *global* ids of its own tokens, in the order
  ``[txt shard r, img shard r]`` that its joint q/k have. Tables are built from those ids: coordinates are
  global and each table row belongs to its token by construction.
* Wan's plan splits the position module's outputs ``0`` and ``1`` along dim 1 and ``hidden_states`` at ``blocks.0``
  along dim 1. The seam (``WanPositions``) takes that split over (:func:`own_output_split`): it asks diffusers'
  own sharder which rows of the grid this rank keeps, builds (and caches) the tables and coordinates of those
  rows only, and the plan's hook passes them on unsplit. So each rank holds ``1/N`` of the tables, never the
  whole sequence's.
* Qwen-Image's plan splits ``pos_embed``'s outputs ``0`` (image table ``[S_img, P]``) and ``1`` (text table) along
  dim 0, ``hidden_states`` / ``encoder_hidden_states`` at ``transformer_blocks.0`` along dim 1 (so rank ``r``'s
  joint q/k are ``[txt shard r, img shard r]``) and ``encoder_hidden_states_mask`` at every block. The seam
  (``QwenPositions``) takes the output split over as Wan's does, one part after the other. It is called with the
  whole sequence's image shapes and text length, so a schedule's extents are the whole image's by construction.
  diffusers 0.42's ring attention cannot take a text mask that masks tokens (the even one applies each rank's local
  mask to every rank's keys: silently wrong; ``ring_anything`` refuses any mask): mmpos refuses that case by name
  (``QWEN.check_inputs``); Ulysses gathers the mask and is exact, even and uneven.
* LTX-Video's plan splits the rope's outputs ``0`` and ``1`` (``(cos, sin)`` ``[B, S, D]``) along dim 1 and
  ``hidden_states``, ``encoder_hidden_states`` and ``encoder_attention_mask`` at the model's input. Its seam takes
  the split over the same way (the grid's extents come from ``num_frames, height, width`` or ``video_coords``,
  which the plan leaves whole); what diffusers cannot shard (a text mask, per-token timesteps) is refused by name.

q and k are rotated on each rank before attention, so ring (K/V passed around) and Ulysses (all-to-all
over heads) attention see already-rotated keys: RoPE's relative property holds across shards.

Scheduled encodings (extrapolation presets) resolve their spectrum from the extents of the whole sequence,
measured before the plan shards the ids (:mod:`.global_extents`), never from the shard's.

Limits: coordinate transforms (``PositionSeam.coords_transform``) must use global quantities only, never
statistics of the local shard (e.g. a grid size taken from ``ids.max()``). ``tests/integrations/test_context_parallel.py``
runs Flux, FLUX.2, Wan, Qwen-Image and LTX-Video on 2 processes (gloo); the single-process tests replay the sharding with
:func:`shard_like_context_parallel`.
"""

from __future__ import annotations

from typing import Optional

import torch

SPLIT_HOOK = "cp_input---{}"  # diffusers' name of a plan's split hook on the module at ``{}``


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


def split_hook(module: torch.nn.Module, name: str) -> Optional[object]:
    """The split hook diffusers' context-parallel plan registered on ``module`` (at ``name``), or ``None`` (one
    process); its ``parallel_config`` is the ``ContextParallelConfig``."""
    registry = getattr(module, "_diffusers_hook", None)
    return registry.get_hook(SPLIT_HOOK.format(name)) if registry is not None else None


def plan_config(module: torch.nn.Module, name: str):
    """The ``ContextParallelConfig`` of the plan's split hook on ``module`` (registered at ``name``), else ``None``."""
    hook = split_hook(module, name)
    return None if hook is None else hook.parallel_config


def own_output_split(module: torch.nn.Module, name: str, split_dim: int = 1) -> Optional[object]:
    """Take over the split of ``module``'s outputs by diffusers' context-parallel plan: returns the plan's split hook
    on ``module`` (registered at ``name``) with its output split switched off (``module`` then returns this rank's
    rows itself, :func:`own_rows`), or ``None`` when no plan splits ``module``'s outputs (one process).

    Every output the plan splits must be split along ``split_dim``, the sequence dim of the seam's outputs (Wan's
    and LTX's ``rope``: outputs 0 and 1 along dim 1; Qwen-Image's ``pos_embed``: outputs 0 and 1 along dim 0)."""
    hook = split_hook(module, name)
    if hook is None or getattr(hook, "_mmpos_owned", False):
        return hook
    outputs = {key: plan for key, plan in hook.metadata.items() if getattr(plan, "split_output", False)}
    if (
        not outputs
        or any(plan.split_dim != split_dim for plan in outputs.values())
        or getattr(hook, "fn_ref", None) is None
    ):
        raise RuntimeError(
            f"the context-parallel plan of {name!r} splits {hook.metadata}; mmpos takes over a split of the "
            f"position module's outputs along dim {split_dim} only (diffusers 0.42's plan)"
        )
    hook.fn_ref.post_forward = _as_built  # this call's too: the hook reads it after the module's forward
    hook._mmpos_owned = True
    return hook


def _as_built(module, output):
    return output


def own_rows(hook, length: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` of a sequence of ``length`` that diffusers' sharder (the hook's own, with its
    ``*_anything`` choice) gives this rank; cached per length. Refuses a length the even split cannot take."""
    rows = getattr(hook, "_mmpos_rows", None)
    if rows is None:
        rows = hook._mmpos_rows = {}
    if length not in rows:
        plan = next(plan for plan in hook.metadata.values() if getattr(plan, "split_output", False))
        shape = [1] * max(plan.expected_dims or 0, plan.split_dim + 1)
        shape[plan.split_dim] = length
        try:
            index = hook._prepare_cp_input(torch.arange(length).view(shape), plan)
        except AssertionError:  # diffusers' even sharder asserts divisibility
            raise ValueError(
                f"the sequence has {length} tokens, not divisible by the context-parallel degree; "
                "use ulysses_anything=True / ring_anything=True in ContextParallelConfig"
            ) from None
        index = index.flatten()
        start, stop = int(index[0]), int(index[-1]) + 1
        if index.numel() != stop - start:
            raise RuntimeError(f"the context-parallel split of {length} rows is not contiguous")
        rows[length] = (start, stop)
    return rows[length]


def parallel_config(model):
    """The ``ParallelConfig`` diffusers recorded on ``model`` (``enable_parallelism``), or ``None``."""
    return getattr(model, "_parallel_config", None)


def is_parallel(model) -> bool:
    """``enable_parallelism`` (context or tensor parallel) was applied to ``model``."""
    return parallel_config(model) is not None


def refuse_after_parallelism(position_attr: str):
    """A family's ``check_model``: refuse ``set_pe`` / ``restore`` on a model already under ``enable_parallelism``
    whose plan hooks the position module at ``position_attr`` (swapping the module would drop the hook: tables
    unsharded while the tokens are)."""

    def check(model) -> None:
        if is_parallel(model):
            raise RuntimeError(
                f"{type(model).__name__}: call set_pe/restore before enable_parallelism (its context-"
                f"parallel plan hooks the `{position_attr}` module that set_pe replaces)"
            )

    return check


def shard_sequence(x: torch.Tensor, dim: int, parallel_config) -> torch.Tensor:
    """This rank's shard of ``x`` along ``dim`` under a processor's ``_parallel_config`` (diffusers' ``ParallelConfig``),
    cut by diffusers' own sharders exactly as the plan cuts the hidden states."""
    from diffusers.hooks.context_parallel import EquipartitionSharder, PartitionAnythingSharder

    config = getattr(parallel_config, "context_parallel_config", parallel_config)
    if config.ulysses_anything or config.ring_anything:
        return PartitionAnythingSharder.shard_anything(x, dim, config._flattened_mesh)
    return EquipartitionSharder.shard(x, dim, config._flattened_mesh)
