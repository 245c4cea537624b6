"""FLUX.1 (dev, Fill, Kontext): joint ``[text | target | context]``; the context image has id axis 0 == 1.

Its edit processor is :class:`~mmpos.pipelines.edits.processor.EditAttnProcessor` (FLUX.1's rules, IP-Adapter
pass-through); :func:`flux_layer_call` gives a rule the same :class:`~.base.LayerCall` as the other families.
"""

from __future__ import annotations

from mmpos.integrations.diffusers.layer_rotation import LayerRotation

from ..processor import EditAttnProcessor, finish_attention, project_heads
from ..segments import segments_from_ids
from .base import FamilyEditAttention, LayerCall


def flux_layer_call(attn, hidden_states, encoder_hidden_states, image_rotary_emb, segments) -> LayerCall:
    """The :class:`LayerCall` of a FLUX.1 double (``encoder_hidden_states`` given) or single block."""
    query, key, value = project_heads(attn, hidden_states, encoder_hidden_states)
    return LayerCall(
        attn,
        query,
        key,
        value,
        segments,
        LayerRotation.wrap(image_rotary_emb),
        None,
        lambda out, dtype: finish_attention(attn, out, encoder_hidden_states, dtype),
    )


class FluxEditAttention(FamilyEditAttention):
    family = "flux"

    def processor_class(self, slot) -> type:
        return EditAttnProcessor

    def sigma(self, args, kwargs):
        if args:
            raise TypeError(
                "EditSession expects the transformer to be called with keyword arguments, as the "
                "diffusers Flux pipelines do"
            )
        return kwargs["timestep"].flatten()[:1]

    def observe(self, context, module, args, kwargs) -> None:
        context.img_ids = kwargs["img_ids"]
        context.segments = segments_from_ids(kwargs["encoder_hidden_states"].shape[1], kwargs["img_ids"])


ADAPTER = FluxEditAttention()
