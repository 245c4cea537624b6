"""mmpos encodings in timm ViTs: ``convert(model, pe=NAME, **options)`` and registered model names.

import timm, mmpos.integrations.timm as mt
model = mt.convert(timm.create_model("vit_small_patch16_224", pretrained=True), pe="rope_mixed")
model = timm.create_model("vit_small_patch16_224_mmpos_rope_axial", pe_theta=100.0)
mt.restore(model)   # undo convert: the timm model as it was, bit for bit

The converted model runs timm's own ``forward`` / ``forward_features`` / ``forward_intermediates`` (so timm's
training scripts, ``checkpoint_seq`` and feature extraction keep working); mmpos takes part at four points, in
this order, all owned by the model's :class:`TokenPositions` (``model.mmpos_positions``, :mod:`.positions`):

1. ``patch_embed.proj`` (its ``Conv2d``; ``patch_embed`` where there is none, ``embeds`` in NaFlexVit) -> forward hook:
   the patch grid or ``patch_coord`` of this forward;
2. ``patch_drop`` -> :class:`~.positions.PositionalPatchDropout` (timm's PatchDropout, same randomness): which
   patch tokens each sample kept;
3. ``norm_pre`` -> forward pre-hook, once per forward before the blocks: coordinates checked once, then the
   rotary tables built (one per shared encoding) or the absolute encoding added to the patch tokens;
4. ``blocks[i].attn`` -> its class swapped for the positional subclass (:mod:`.attention`; weights, names and
   options untouched): projects q, k, v, applies its encoding's table of this forward, attends.

A forward's positions and tables live per calling thread, so one model serves several threads at once.
:func:`convert` installs all four (:mod:`.convert`), :func:`restore` removes them (:mod:`.restore`).
"""

from ...encodings.per_block import no_weight_decay_names
from ..pe_parameters import freeze_all_but_pe, named_pe_parameters, pe_parameters, train_only_pe
from .attention import PositionalAttention, PositionalAttentionRope, PositionalEvaAttention
from .convert import convert
from .models import register_timm_models, timm_model_name
from .positions import TokenPositions
from .restore import restore
from .sharding import fully_shard_blocks, shared_encoding_params

register_timm_models()

__all__ = [
    "convert",
    "freeze_all_but_pe",
    "fully_shard_blocks",
    "named_pe_parameters",
    "no_weight_decay_names",
    "pe_parameters",
    "train_only_pe",
    "PositionalAttention",
    "PositionalAttentionRope",
    "PositionalEvaAttention",
    "register_timm_models",
    "restore",
    "shared_encoding_params",
    "timm_model_name",
    "TokenPositions",
]
