"""Qwen-Image 2.1: one block-causal joint sequence ``[prefix | target]``, complex ``[S, P]`` table, KV cache.

The prefix is the text with the condition images spliced in; the target image comes last. Attention is
block-causal (text causal, each image block bidirectional, the target sees everything). A :class:`LayerCall`
holds the whole joint sequence and its :meth:`~Qwen21LayerCall.attend` keeps that structure: prefix queries
attend causally to their own sequence only, target queries to all keys, including keys a rule appends after the
sequence (the shared reference's). The prefix therefore never changes under an edit, and the pipeline's KV cache
stays valid: at the first step (``"extract"``) the adapter stores the stock post-RoPE prefix keys; at the later
steps (``"cached"``) the call's sequence is ``[cached prefix | target]`` again: zero queries and identity rotation
rows stand for the cached prefix (already rotated), and only the target's rows are computed and returned.

Segments from the coordinates (``QwenImage21Rope``'s positions, :func:`~mmpos.integrations.diffusers.families
.qwenimage21.qwen21_positions`): each image block sits at one frame position; the target is the block at the
largest one (it must end the sequence), the condition images (``references``) are the others, inside the prefix
(``text`` is the whole prefix; ``context_len`` is 0: the condition images are not one contiguous block).
The key mask is the model's ``key_valid`` (prefill) or the decode mask (padded text keys dropped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21FlexAttnProcessor, apply_rotary_emb_qwen

from mmpos.integrations.diffusers.families.qwenimage21 import qwen21_positions
from mmpos.integrations.diffusers.installer import EDIT
from mmpos.integrations.diffusers.layer_rotation import LayerRotation
from mmpos.ops.tables import RotaryTable

from ..processor import EditAttnProcessor
from ..segments import TokenSegments, grid_shape, runs_by_value
from .base import FamilyEditAttention, LayerCall

_TOKENS_PER_SLOT = 4  # each vision-language image slot stands for 2 x 2 latent tokens


class Qwen21EditAttnProcessor(EditAttnProcessor):
    """The edit level of a Qwen-Image 2.1 block (``QwenImage21AttnProcessor``'s signature)."""

    def __call__(
        self,
        attn,
        hidden_states,
        attention_mask=None,
        rotary_emb=None,
        layer_cache=None,
        kv_cache_mode=None,
        cache_write_slice=None,
        segments=None,
        key_valid=None,
    ):
        return self.run(
            attn,
            dict(
                hidden_states=hidden_states,
                attention_mask=attention_mask,
                rotary_emb=rotary_emb,
                layer_cache=layer_cache,
                kv_cache_mode=kv_cache_mode,
                cache_write_slice=cache_write_slice,
                segments=segments,
                key_valid=key_valid,
            ),
        )


class Qwen21FlexEditAttnProcessor(Qwen21EditAttnProcessor, QwenImage21FlexAttnProcessor):
    """Over a ``QwenImage21FlexAttnProcessor``: an instance of it, so that the model still builds the
    ``BlockMask`` the processor beneath needs (the rule's attention does not read it)."""


def qwen21_segments(img_shapes, image_pad_mask: torch.Tensor) -> TokenSegments:
    """Segments of the joint sequence ``[prefix | target]`` from the blocks' frame positions (see module doc)."""
    is_image = image_pad_mask.tolist()
    frame, rows, cols, _ = qwen21_positions(img_shapes, is_image)
    image_at = torch.nonzero(image_pad_mask).flatten()
    coords = torch.stack(
        [torch.tensor(frame, dtype=torch.float64)[image_at], torch.tensor(rows).double(), torch.tensor(cols).double()],
        dim=-1,
    )  # [N_image, 3]
    runs = runs_by_value(coords[:, 0])  # per image block, sorted by frame position
    blocks = [slice(int(image_at[r.start]), int(image_at[r.stop - 1]) + 1) for _, r in runs]
    target = blocks[-1]
    if target.stop != len(is_image) or target.stop - target.start != runs[-1][1].stop - runs[-1][1].start:
        raise ValueError("img_shapes: expected the target image (the largest frame position) to end the sequence")
    return TokenSegments(
        target.start,
        target.stop - target.start,
        target_grid=grid_shape(coords[runs[-1][1]]),
        target_start=target.start,
        references=tuple(blocks[:-1]),
    )


def prefix_blocks(img_shapes, image_pad_mask: torch.Tensor, prefix_len: int) -> list[tuple[int, int, bool]]:
    """``(start, stop, is_text)`` runs of the prefix: each text run, and each image block (``img_shapes``' counts,
    so that adjacent condition images stay separate blocks), as the stock processor's prefill walks them."""
    is_image = image_pad_mask[:prefix_len].tolist()
    sizes = iter([h * w * f for f, h, w in img_shapes[:-1]])
    out, start = [], 0
    while start < prefix_len:
        if is_image[start]:
            stop = start + next(sizes)
        else:
            stop = start
            while stop < prefix_len and not is_image[stop]:
                stop += 1
        out.append((start, stop, not is_image[start]))
        start = stop
    return out


@dataclass
class Qwen21LayerCall(LayerCall):
    """A :class:`LayerCall` whose ``attend`` is block-causal over ``[prefix | target | appended keys]``.

    ``blocks``: the prefix runs (:func:`prefix_blocks`); ``cached``: the prefix comes from the KV cache (its rows
    are not computed: zeros, dropped by ``finish``).
    """

    blocks: tuple = ()
    cached: bool = False

    def attend(self, query, key, value, key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``query [b, S, H, D]``, ``key, value [b, S + E, H, D]`` (E keys appended: seen by the target only),
        ``key_mask [b, S + E]`` bool -> ``[b, S, H, D]``."""
        prefix = self.segments.target_start
        target = super().attend(query[:, prefix:], key, value, key_mask)
        if self.cached:
            return torch.cat([target.new_zeros(target.shape[0], prefix, *target.shape[2:]), target], dim=1)
        outs = [self._prefix_run(query, key, value, key_mask, run) for run in self.blocks]
        return torch.cat(outs + [target], dim=1)

    def _prefix_run(self, query, key, value, key_mask, run):
        start, stop, is_text = run
        mask = None if key_mask is None else key_mask[:, None, None, :stop]
        if is_text:
            ones = torch.ones(stop - start, stop, dtype=torch.bool, device=query.device)
            causal = torch.tril(ones, diagonal=start)[None, None]
            mask = causal if mask is None else causal & mask
        processor = self.attn.processor
        return dispatch_attention_fn(
            query[:, start:stop],
            key[:, :stop],
            value[:, :stop],
            attn_mask=mask,
            parallel_config=getattr(processor, "_parallel_config", None),
        )


class Qwen21EditAttention(FamilyEditAttention):
    family = "qwenimage21"

    def processor_class(self, slot) -> type:
        flex = isinstance(slot.below(EDIT), QwenImage21FlexAttnProcessor)
        return Qwen21FlexEditAttnProcessor if flex else Qwen21EditAttnProcessor

    def sigma(self, args, kwargs):
        return kwargs.get("timestep", args[2] if len(args) > 2 else None).flatten()[:1]  # the pipeline passes sigma

    def observe(self, context, module, args, kwargs) -> None:
        img_shapes = kwargs.get("img_shapes", args[3] if len(args) > 3 else None)[0]
        img_mask = kwargs.get("img_mask", args[4] if len(args) > 4 else None)
        repeats = torch.where(img_mask[0], _TOKENS_PER_SLOT, 1)
        image_pad_mask = torch.repeat_interleave(img_mask[0], repeats).cpu()
        context.segments = qwen21_segments(img_shapes, image_pad_mask)
        context.layout = prefix_blocks(img_shapes, image_pad_mask, context.segments.target_start)

    def layer_call(self, processor, attn, inputs: dict) -> Optional[LayerCall]:
        segments = processor.context.segments
        if segments is None or segments.target_len == 0:
            return None
        rotation = processor.layer_rotation(self, inputs["rotary_emb"])
        if inputs.get("kv_cache_mode") == "cached":
            rotation = self._padded(processor.context, rotation, segments.target_start)
        blocks, cached = tuple(processor.context.layout), inputs.get("kv_cache_mode") == "cached"
        return self.make_call(attn, inputs, segments, rotation, Qwen21LayerCall, blocks=blocks, cached=cached)

    @staticmethod
    def _padded(context, rotation: LayerRotation, prefix: int) -> LayerRotation:
        """The target rows' rotation after ``prefix`` identity rows (the cached, already rotated keys)."""
        key = ("qwen21_padded", id(rotation))
        cached = context.cache.get(key)
        if cached is None or cached[0] is not rotation:
            cis = rotation.table.cis
            ones = torch.ones(prefix, cis.shape[-1], dtype=cis.dtype, device=cis.device)
            cached = context.cache[key] = (rotation, LayerRotation(RotaryTable(torch.cat([ones, cis], dim=0))))
        return cached[1]

    def project(self, attn, inputs):
        hidden_states = inputs["hidden_states"]
        head_dim = attn.inner_dim // attn.heads
        query, key, value = (f(hidden_states).unflatten(-1, (-1, head_dim)) for f in (attn.to_q, attn.to_k, attn.to_v))
        query, key = attn.norm_q(query).to(value.dtype), attn.norm_k(key).to(value.dtype)
        cache, mode = inputs.get("layer_cache"), inputs.get("kv_cache_mode")
        if cache is not None and mode == "extract" and inputs.get("cache_write_slice") is not None:
            rotated = apply_rotary_emb_qwen(key, inputs["rotary_emb"], use_real=False)  # as the stock processor
            cache.store(rotated[:, inputs["cache_write_slice"]].clone(), value[:, inputs["cache_write_slice"]].clone())
        elif cache is not None and mode == "cached":
            cached_k, cached_v = cache.get()
            query = torch.cat([query.new_zeros(query.shape[0], cached_k.shape[1], *query.shape[2:]), query], dim=1)
            key, value = torch.cat([cached_k, key], dim=1), torch.cat([cached_v, value], dim=1)
        return query, key, value, None

    def rotary_emb(self, inputs):
        return inputs["rotary_emb"]

    def rotation(self, beneath, rotary_emb, layer: int) -> LayerRotation:
        return LayerRotation(RotaryTable(rotary_emb))

    def key_mask(self, inputs, segments, batch, length):
        if inputs.get("kv_cache_mode") == "cached":
            mask = inputs.get("attention_mask")
            return None if mask is None else mask[:, 0, 0, :]
        return inputs.get("key_valid")

    def finish(self, attn, inputs, state, out, dtype):
        out = out[:, -inputs["hidden_states"].shape[1] :]  # cached: the target's rows only
        return attn.to_out[1](attn.to_out[0](out.flatten(2, 3).to(dtype)))


ADAPTER = Qwen21EditAttention()
