"""FSDP2 per block: ``fully_shard`` on every block of a model, then on the model (its root group).

Each block's parameters are gathered only for that block's forward and backward; what is left outside the blocks
(embeddings, the output layer, encodings the model keeps on itself) forms the root group, gathered once before the
blocks run. A table is therefore correct when it is built where its encoding's parameters are gathered: inside the
block for an encoding under that block (the timm integration, :class:`~.forward_tables.ForwardTables`
``in_block``), before the blocks for an encoding on the model itself (the reference DiT's ``rotary_pes``).

    from mmpos.ops.sharding import fully_shard_blocks
    fully_shard_blocks(model)    # in each process, after init_process_group; then build the optimizer
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from torch import nn


def fully_shard_blocks(model: nn.Module, blocks: Iterable[nn.Module] | None = None, **fsdp_options: Any) -> nn.Module:
    """Apply FSDP2's ``fully_shard`` to every block of ``model``, then to ``model``, in place.

    Args:
        model: the model; its ``blocks`` are sharded when ``blocks`` is not given.
        blocks: the modules to shard one by one (each its own all-gather group).
        **fsdp_options: passed to every ``fully_shard`` call (``mesh``, ``mp_policy``, ``reshard_after_forward``).
    Returns:
        ``model`` (now an ``FSDPModule``).
    """
    if blocks is None:
        blocks = getattr(model, "blocks", None)
        if not isinstance(blocks, nn.ModuleList):
            raise TypeError(f"fully_shard_blocks: {type(model).__name__} has no `blocks` ModuleList; pass blocks=")
    fully_shard = fsdp2_fully_shard()
    for block in blocks:
        fully_shard(block, **fsdp_options)
    sharded: nn.Module = fully_shard(model, **fsdp_options)
    return sharded


def fsdp2_fully_shard() -> Callable[..., Any]:
    """torch's FSDP2 ``fully_shard`` (``torch.distributed.fsdp`` from torch 2.6, ``_composable.fsdp`` before)."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError as error:
            raise ImportError(
                "fully_shard_blocks needs FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.4 "
                "with distributed support)"
            ) from error
    return fully_shard
