"""FSDP2 for a converted timm ViT: ``fully_shard`` per block, then the root.

A block's own learned encoding (``rope_mixed``, ``comrope_*``, ``liere``: one per block by default) is sharded with
its block and builds its table inside that block, where FSDP has gathered it. A learned encoding shared by every
block (``share_pe=True``) builds one table before the blocks from parameters that live under every block, which
per-block FSDP cannot gather there: it is refused (:func:`shared_encoding_params` names those parameters). The
sharding itself is :func:`mmpos.ops.sharding.fully_shard_blocks`, which the reference DiT uses as it is.

    import mmpos.integrations.timm as mt
    mt.fully_shard_blocks(model)            # in each process, after init_process_group; then build the optimizer
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ...ops.sharding import fully_shard_blocks as shard_per_block
from .positions import block_owned


def shared_encoding_params(model: nn.Module) -> set[nn.Parameter]:
    """Parameters of the converted ``model``'s rotary encodings that more than one block uses."""
    encodings = [block.attn.pe for block in model.blocks if hasattr(block.attn, "pe")]
    own = {id(pe) for pe in block_owned(encodings)}
    return {p for pe in encodings if id(pe) not in own for p in pe.parameters()}


def fully_shard_blocks(model: nn.Module, **fsdp_options: Any) -> nn.Module:
    """Apply FSDP2's ``fully_shard`` to every block of the converted ``model``, then to the model, in place.

    Args:
        model: a timm ViT converted by :func:`~.convert.convert` (its ``blocks``).
        **fsdp_options: passed to every ``fully_shard`` call (``mesh``, ``mp_policy``, ``reshard_after_forward``).
    Returns:
        ``model`` (now an ``FSDPModule``).
    """
    if not hasattr(model, "mmpos_positions"):
        raise TypeError(
            f"fully_shard_blocks expects a model converted by mmpos.integrations.timm.convert; got a "
            f"{type(model).__name__} without mmpos positions"
        )
    shared = shared_encoding_params(model)
    if shared:
        raise ValueError(
            f"model.blocks share one learned {model.mmpos_pe!r} encoding ({len(shared)} parameter "
            "tensor(s) under every block): per-block FSDP cannot gather it where its table is built. "
            "Convert with share_pe=False (one encoding per block, the default for learned ones) or "
            "train with DDP"
        )
    return shard_per_block(model, model.blocks, **fsdp_options)
