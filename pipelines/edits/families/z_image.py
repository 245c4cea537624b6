"""Z-Image: single stream (``ZSingleStreamAttnProcessor``); the noise refiner sees the image tokens, the context
refiner the caption, the main layers ``[image | caption]`` per sample, padded to the batch.

Segments from the model's own ids (``patchify_and_embed``, run on the forward's inputs in the edit's hook): image
tokens are ``(caption length + 1, row, col)``, the padding that rounds each part to 32 tokens is ``(0, 0, 0)``; the
target is the image tokens (the padding after them is neither target nor text). Context-refiner layers have no
image tokens: the edit runs the processor beneath there. ``freqs_cis`` is the padded per-sample complex table
``[B, S, P]`` (stock), or under ``set_pe`` the packed tables ``[B, S, G, 2P]``; the key mask is the processor's
``attention_mask`` (batch padding).
"""

from __future__ import annotations

import torch

from mmpos.integrations.diffusers.layer_rotation import LayerRotation
from mmpos.integrations.diffusers.processors import EncodingRotation
from mmpos.ops.tables import RotaryTable

from ..processor import EditAttnProcessor
from ..segments import TokenSegments, grid_shape
from .base import FamilyEditAttention


class ZImageEditAttnProcessor(EditAttnProcessor):
    """The edit level of a Z-Image block (``ZSingleStreamAttnProcessor``'s signature)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, freqs_cis=None):
        return self.run(
            attn,
            dict(
                hidden_states=hidden_states,
                encoder_hidden_states=encoder_hidden_states,
                attention_mask=attention_mask,
                freqs_cis=freqs_cis,
            ),
        )


def _argument(args, kwargs, name, index, default=None):
    return kwargs.get(name, args[index] if len(args) > index else default)


def z_image_segments(x_pos_ids, text_len: int) -> dict:
    """Per layer kind (``"noise_refiner"``, ``"layers"``), the segments from the per-sample image ids ``[S_i, 3]``
    (padding included) and the first sample's padded caption length (``"context_refiner"``: ``None``, no image
    tokens)."""
    ranges = []
    for ids in x_pos_ids:
        image = torch.nonzero(ids[:, 0] != 0).flatten()  # padding is (0, 0, 0); image tokens have index >= 1
        start, stop = int(image[0]), int(image[-1]) + 1
        if stop - start != image.numel():
            raise ValueError("Z-Image: the image tokens are not contiguous in the sequence")
        ranges.append((start, stop, len(ids)))
    if len(set(ranges)) != 1:
        raise ValueError(f"Z-Image edits need the same image size for every sample, got token ranges {ranges}")
    start, stop, x_len = ranges[0]
    grid = grid_shape(x_pos_ids[0][start:stop].float())
    refiner = TokenSegments(0, stop - start, target_grid=grid, target_start=start)
    main = TokenSegments(text_len, stop - start, target_grid=grid, text_start=x_len, target_start=start)
    return {"noise_refiner": refiner, "context_refiner": None, "layers": main}


class ZImageEditAttention(FamilyEditAttention):
    family = "z_image"

    def processor_class(self, slot) -> type:
        return ZImageEditAttnProcessor

    def sigma(self, args, kwargs):
        return 1 - _argument(args, kwargs, "t", 1).flatten()[:1]  # the pipeline passes t = 1 - sigma

    def observe(self, context, module, args, kwargs) -> None:
        x, cap_feats = _argument(args, kwargs, "x", 0), _argument(args, kwargs, "cap_feats", 2)
        if isinstance(x[0], list):
            raise NotImplementedError("edits on Z-Image Omni (lists of images per sample) are not implemented")
        patch, f_patch = _argument(args, kwargs, "patch_size", 7, 2), _argument(args, kwargs, "f_patch_size", 8, 1)
        images, captions, _, x_pos_ids, _, _, _ = module.patchify_and_embed(x, cap_feats, patch, f_patch)
        x_pos_ids = [ids[: len(tokens)] for ids, tokens in zip(x_pos_ids, images)]
        context.layout = z_image_segments(x_pos_ids, len(captions[0]))
        context.segments = context.layout["layers"]

    def segments(self, context, slot, inputs):
        return context.layout[slot.name.split(".")[0]]

    def project(self, attn, inputs):
        hidden_states = inputs["hidden_states"]
        query, key, value = (
            f(hidden_states).unflatten(-1, (attn.heads, -1)) for f in (attn.to_q, attn.to_k, attn.to_v)
        )
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        return query, key, value, None

    def rotary_emb(self, inputs):
        return inputs["freqs_cis"]

    def rotation(self, beneath, rotary_emb, layer: int) -> LayerRotation:
        rotation = getattr(beneath, "rotation", None)
        if isinstance(rotation, EncodingRotation):  # set_pe: packed [B, S, G, 2P]
            return LayerRotation((rotary_emb, None), rotation, layer)
        return LayerRotation(RotaryTable(rotary_emb[:, None]))  # [B, 1, S, P]: per sample, shared by the heads

    def key_mask(self, inputs, segments, batch, length):
        mask = inputs.get("attention_mask")
        if mask is not None and mask.ndim != 2:
            raise NotImplementedError(f"Z-Image edits take a [B, S] attention_mask, got {tuple(mask.shape)}")
        return mask

    def finish(self, attn, inputs, state, out, dtype):
        output = attn.to_out[0](out.flatten(2, 3).to(dtype))
        return attn.to_out[1](output) if len(attn.to_out) > 1 else output


ADAPTER = ZImageEditAttention()
