"""FLUX.1 (dev, Fill, Kontext): joint ``[text | target | context]`` in double blocks (``encoder_hidden_states``
given) and single blocks; the context image (Kontext) has id axis 0 == 1.

The processor keeps diffusers' FLUX.1 signature, IP-Adapter arguments included: diffusers' ``FluxAttention`` hands a
processor only the arguments its signature names, so the edit processor names the ones diffusers' Flux processors
take (``ip_hidden_states``, ``ip_adapter_masks``) and passes every one the processor beneath accepts. With a rule
active, the rule edits the joint text-image attention only; the IP-Adapter term (a decoupled cross-attention from the
image queries, before RoPE, to the image-prompt tokens: it has no positions) is computed as the IP-Adapter processor
beneath computes it and returned beside the rule's output, so a loaded IP-Adapter keeps acting on edited layers.
"""

from __future__ import annotations

import functools
import inspect

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_flux import _get_qkv_projections

from mmpos.integrations.diffusers.layer_rotation import LayerRotation

from ..processor import EditAttnProcessor, finish_attention, project_heads
from ..segments import segments_from_ids
from .base import FamilyEditAttention, LayerCall


class FluxEditAttnProcessor(EditAttnProcessor):
    """The edit level of a FLUX.1 double or single block (``FluxAttnProcessor``'s signature, IP-Adapter's too)."""

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        attention_mask=None,
        image_rotary_emb=None,
        ip_hidden_states=None,
        ip_adapter_masks=None,
    ):
        beneath = self.beneath
        given = {"ip_hidden_states": ip_hidden_states, "ip_adapter_masks": ip_adapter_masks}
        accepted = _call_parameters(type(beneath))
        passed = {name: value for name, value in given.items() if value is not None and name in accepted}
        inputs = dict(
            hidden_states=hidden_states,
            encoder_hidden_states=encoder_hidden_states,
            attention_mask=attention_mask,
            image_rotary_emb=image_rotary_emb,
        )
        rule = self.context.active_rule(self.layer_index)
        call = None if rule is None else self.adapter.layer_call(self, attn, inputs)
        if call is None:
            return beneath(attn, **inputs, **passed)
        if attention_mask is not None:
            raise NotImplementedError(f"{type(rule).__name__} does not support an attention_mask")
        out = rule.attend_call(call, self.context)
        if "ip_hidden_states" in passed and encoder_hidden_states is not None:
            return (*out, ip_adapter_term(beneath, attn, hidden_states, passed["ip_hidden_states"]))
        return out


def flux_layer_call(attn, hidden_states, encoder_hidden_states, image_rotary_emb, segments) -> LayerCall:
    """The :class:`LayerCall` of a FLUX.1 double (``encoder_hidden_states`` given) or single block, with the
    rotation ``image_rotary_emb`` (the stock ``(cos, sin)`` or a :class:`LayerRotation`)."""
    return ADAPTER.make_call(
        attn,
        dict(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states),
        segments,
        LayerRotation.wrap(image_rotary_emb),
    )


class FluxEditAttention(FamilyEditAttention):
    family = "flux"

    def processor_class(self, slot) -> type:
        return FluxEditAttnProcessor

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

    def project(self, attn, inputs: dict):
        return (*project_heads(attn, inputs["hidden_states"], inputs["encoder_hidden_states"]), None)

    def rotary_emb(self, inputs: dict):
        return inputs["image_rotary_emb"]

    def finish(self, attn, inputs: dict, state, out: torch.Tensor, dtype: torch.dtype):
        return finish_attention(attn, out, inputs["encoder_hidden_states"], dtype)

    def image_coords(self, inputs):
        """``img_ids (index, row, col)``: the target at index 0, Kontext's context image at 1."""
        ids = inputs["img_ids"]
        return (ids[0] if ids.ndim == 3 else ids).float()

    def table_at(self, transformer, inputs, image_coords):
        txt_ids = inputs["txt_ids"]
        text = (txt_ids[0] if txt_ids.ndim == 3 else txt_ids).to(image_coords)
        return transformer.pos_embed(torch.cat([text, image_coords]))

    def grid_coords(self, ids, grid):
        return ids

    def move_ids(self, kwargs, coords, grid):
        """``img_ids`` replaced by ``coords`` (in its dtype): FLUX.1 Fill's ``img_ids`` are the canvas grid's."""
        native = kwargs["img_ids"]
        if native.shape[-2:] != coords.shape:
            raise ValueError(
                f"transplanted ids {tuple(coords.shape)} do not match the pipeline's img_ids "
                f"{tuple(native.shape)}; the canvas and the call's height/width disagree"
            )
        return {**kwargs, "img_ids": coords.to(device=native.device, dtype=native.dtype)}


@functools.lru_cache(maxsize=None)
def _call_parameters(processor_type) -> frozenset:
    """Names a processor class's ``__call__`` takes (diffusers filters a processor's kwargs the same way)."""
    return frozenset(inspect.signature(processor_type.__call__).parameters)


def ip_adapter_term(processor, attn, hidden_states, ip_hidden_states) -> torch.Tensor:
    """The IP-Adapter output ``[B, N, heads * D]`` of a double block, as diffusers' ``FluxIPAdapterAttnProcessor``
    forms it: ``sum_i scale_i * softmax(q k_i^T / sqrt(D)) v_i`` with the image queries after their norm and
    before RoPE, and ``k_i, v_i`` projected from each adapter's image-prompt tokens ``ip_hidden_states[i]``."""
    batch = hidden_states.shape[0]
    query = attn.norm_q(_get_qkv_projections(attn, hidden_states, None)[0].unflatten(-1, (attn.heads, -1)))
    total = torch.zeros(
        batch, hidden_states.shape[1], attn.heads * attn.head_dim, dtype=query.dtype, device=query.device
    )
    for states, scale, to_k, to_v in zip(ip_hidden_states, processor.scale, processor.to_k_ip, processor.to_v_ip):
        key = to_k(states).view(batch, -1, attn.heads, attn.head_dim)
        value = to_v(states).view(batch, -1, attn.heads, attn.head_dim)
        out = dispatch_attention_fn(
            query, key, value, backend=processor._attention_backend, parallel_config=processor._parallel_config
        )
        total += scale * out.reshape(batch, -1, attn.heads * attn.head_dim).to(query.dtype)
    return total


ADAPTER = FluxEditAttention()
