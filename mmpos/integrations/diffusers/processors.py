"""Attention processors for Flux and Wan whose q/k rotation comes from mmpos.

Each processor is the stock one (diffusers 0.42, Apache-2.0) with the rotation step delegated to a
``rotation(q, k, rotary_emb, layer) -> (q, k)`` callable; attention runs through diffusers'
``dispatch_attention_fn`` (SDPA by default; any dispatch backend, and context parallelism, via
``_attention_backend`` / ``_parallel_config`` like the stock processors).

Rotations:
* :func:`flux_stock_rotation`, :func:`wan_stock_rotation`: the stock arithmetic on the stock ``(cos, sin)``
  format (``pe="native"``: bit-identical to the stock model);
* :class:`EncodingRotation`: an mmpos encoding's operator on its own tables: every ``RotaryPE`` has
  ``table(coords, dtype, device)`` and ``rotate_qk(q, k, table)`` (HARoPE's applies ``M q`` and ``M^-T k``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers import transformer_flux, transformer_wan

from .positions import LayerTables, unpack_table


def flux_stock_rotation(query, key, rotary_emb, layer):
    return apply_rotary_emb(query, rotary_emb, sequence_dim=1), apply_rotary_emb(key, rotary_emb, sequence_dim=1)


def wan_stock_rotation(query, key, rotary_emb, layer):
    return _wan_rotate(query, *rotary_emb), _wan_rotate(key, *rotary_emb)


def _wan_rotate(x, freqs_cos, freqs_sin):
    """``WanAttnProcessor``'s nested ``apply_rotary_emb``, expression for expression."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class EncodingRotation:
    """Rotate q and k (``[B, S, H, D]``) with mmpos encodings.

    Args:
        encodings: one encoding shared by every layer, or one per attention layer (``per_layer``).
        group_sizes: per encoding, the table's group count (1, or the heads for per-head tables): where
            its table sits in Wan's packed format.
    """

    def __init__(self, encodings: Sequence, per_layer: bool, group_sizes: Sequence[int]):
        self.encodings = list(encodings)
        self.per_layer = per_layer
        self.group_starts = [sum(group_sizes[:i]) for i in range(len(group_sizes))]
        self.group_sizes = list(group_sizes)

    def table(self, rotary_emb, index: int):
        if isinstance(rotary_emb, LayerTables):
            return rotary_emb[index]
        packed = rotary_emb[0]
        return unpack_table(packed, self.group_starts[index], self.group_sizes[index])

    def __call__(self, query, key, rotary_emb, layer: int):
        index = layer if self.per_layer else 0
        pe, table = self.encodings[index], self.table(rotary_emb, index)
        return pe.rotate_qk(query, key, table)


class _PEProcessor:
    """Shared state of the processors: the rotation, this layer's index, and diffusers' dispatch settings."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, rotation=None, layer: int | None = None, attention_backend=None, parallel_config=None):
        if rotation is None or layer is None:  # diffusers' load_ip_adapter re-creates processors without arguments
            raise TypeError(
                f"{type(self).__name__} is made by set_pe (it needs the rotation and the layer index): "
                "load_ip_adapter after set_pe is not supported (the IP-Adapter's processors would replace "
                "the encoding's and drop the PE); IP-Adapters run with the stock PE and under "
                "mmpos.pipelines' editing pipelines"
            )
        self.rotation, self.layer = rotation, layer
        self._attention_backend, self._parallel_config = attention_backend, parallel_config

    def _attend(self, query, key, value, mask, parallel_config):
        return dispatch_attention_fn(
            query, key, value, attn_mask=mask, backend=self._attention_backend, parallel_config=parallel_config
        )


def processors_beneath(beneath, rotation, processor_class) -> dict:
    """One mmpos processor per layer (layer index -> processor) over ``beneath`` (``(name, stock processor)``
    pairs), keeping each stock processor's dispatch backend and parallel config; ``processor_class(stock)`` picks
    the class (families with several attention kinds)."""
    return {
        layer: processor_class(stock)(
            rotation, layer, getattr(stock, "_attention_backend", None), getattr(stock, "_parallel_config", None)
        )
        for layer, (_, stock) in enumerate(beneath)
    }


def flux_project_heads(attn, hidden_states, encoder_hidden_states=None):
    """q, k, v as ``[B, S, H, D]`` after qk-norm, text prepended in double blocks; RoPE not yet applied.

    Same operations, in the same order, as diffusers' ``FluxAttnProcessor``.
    """
    query, key, value, encoder_query, encoder_key, encoder_value = transformer_flux._get_qkv_projections(
        attn, hidden_states, encoder_hidden_states
    )
    query = attn.norm_q(query.unflatten(-1, (-1, attn.head_dim)))
    key = attn.norm_k(key.unflatten(-1, (-1, attn.head_dim)))
    value = value.unflatten(-1, (-1, attn.head_dim))
    if attn.added_kv_proj_dim is not None:
        encoder_query = attn.norm_added_q(encoder_query.unflatten(-1, (-1, attn.head_dim)))
        encoder_key = attn.norm_added_k(encoder_key.unflatten(-1, (-1, attn.head_dim)))
        encoder_value = encoder_value.unflatten(-1, (-1, attn.head_dim))
        query = torch.cat([encoder_query, query], dim=1)
        key = torch.cat([encoder_key, key], dim=1)
        value = torch.cat([encoder_value, value], dim=1)
    return query, key, value


def flux_finish_attention(attn, hidden_states, encoder_hidden_states, dtype):
    """Merge heads and apply the output projections exactly as the stock processor does."""
    hidden_states = hidden_states.flatten(2, 3).to(dtype)
    if encoder_hidden_states is None:
        return hidden_states
    text_len = encoder_hidden_states.shape[1]
    encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
        [text_len, hidden_states.shape[1] - text_len], dim=1
    )
    hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.contiguous()))
    encoder_hidden_states = attn.to_add_out(encoder_hidden_states.contiguous())
    return hidden_states, encoder_hidden_states


class FluxPEAttnProcessor(_PEProcessor):
    """``FluxAttnProcessor`` with the rotation from mmpos (joint text+image sequence, ``[B, S, H, D]``)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        query, key, value = flux_project_heads(attn, hidden_states, encoder_hidden_states)
        if image_rotary_emb is not None:
            query, key = self.rotation(query, key, image_rotary_emb, self.layer)

        hidden_states = self._attend(query, key, value, attention_mask, self._parallel_config)
        return flux_finish_attention(attn, hidden_states, encoder_hidden_states, query.dtype)


class WanPEAttnProcessor(_PEProcessor):
    """``WanAttnProcessor`` (self-attention, I2V image branch included) with the rotation from mmpos."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        encoder_hidden_states_img = None
        if attn.add_k_proj is not None:
            image_context_length = encoder_hidden_states.shape[1] - 512  # the stock processor's constant
            encoder_hidden_states_img = encoder_hidden_states[:, :image_context_length]
            encoder_hidden_states = encoder_hidden_states[:, image_context_length:]

        query, key, value = transformer_wan._get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))

        if rotary_emb is not None:
            query, key = self.rotation(query, key, rotary_emb, self.layer)

        hidden_states_img = None
        if encoder_hidden_states_img is not None:
            key_img, value_img = transformer_wan._get_added_kv_projections(attn, encoder_hidden_states_img)
            key_img = attn.norm_added_k(key_img).unflatten(2, (attn.heads, -1))
            value_img = value_img.unflatten(2, (attn.heads, -1))
            hidden_states_img = self._attend(query, key_img, value_img, None, None).flatten(2, 3).type_as(query)

        parallel_config = self._parallel_config if encoder_hidden_states is None else None
        hidden_states = self._attend(query, key, value, attention_mask, parallel_config)
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        if hidden_states_img is not None:
            hidden_states = hidden_states + hidden_states_img
        return attn.to_out[1](attn.to_out[0](hidden_states))
