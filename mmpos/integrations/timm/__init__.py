"""mmpos encodings in timm ViTs: ``convert(model, pe=NAME, **options)`` and registered model names.

import timm, mmpos.integrations.timm as mt
model = mt.convert(timm.create_model("vit_small_patch16_224", pretrained=True), pe="rope_mixed")
model = timm.create_model("vit_small_patch16_224_mmpos_rope_axial", pe_theta=100.0)
mt.restore(model)   # undo convert: the timm model as it was, bit for bit
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
