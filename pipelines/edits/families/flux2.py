"""FLUX.2 (dev, Klein): joint ``[text | image tokens]`` in double blocks (``Flux2AttnProcessor``) and in the
parallel single blocks (``Flux2ParallelSelfAttnProcessor``: fused QKV + MLP); ids ``(t, h, w, l)``.

Segments from the ids: the target image is the tokens at the smallest ``t`` (0), each reference image one ``t``
(10, 20, ...: the pipelines' ``_prepare_image_ids``), in ``t`` order, wherever they sit in the sequence. The
rotation is diffusers' ``(cos, sin) [S, D]`` (interleaved pairs, as FLUX.1), or under ``set_pe`` the encoding's
table from ``(packed [S, G, 2P], coords)``.
"""

from __future__ import annotations

import torch

from mmpos.integrations.diffusers.layer_rotation import LayerRotation
from mmpos.integrations.diffusers.processors import EncodingRotation

from ..processor import EditAttnProcessor
from ..segments import TokenSegments, grid_shape, runs_by_value
from .base import FamilyEditAttention, grid_cells


class Flux2EditAttnProcessor(EditAttnProcessor):
    """The edit level of a FLUX.2 double block (``Flux2AttnProcessor``'s signature)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        return self.run(
            attn,
            dict(
                hidden_states=hidden_states,
                encoder_hidden_states=encoder_hidden_states,
                attention_mask=attention_mask,
                image_rotary_emb=image_rotary_emb,
            ),
        )


class Flux2ParallelEditAttnProcessor(EditAttnProcessor):
    """The edit level of a FLUX.2 single block (``Flux2ParallelSelfAttnProcessor``'s signature)."""

    def __call__(self, attn, hidden_states, attention_mask=None, image_rotary_emb=None):
        return self.run(
            attn, dict(hidden_states=hidden_states, attention_mask=attention_mask, image_rotary_emb=image_rotary_emb)
        )


def flux2_segments(text_len: int, img_ids: torch.Tensor) -> TokenSegments:
    """Segments of ``[text | image tokens]`` from ``img_ids [S, 4]``: target at the smallest ``t``, references at
    the others (each one contiguous run; all references one block before or after the target)."""
    if img_ids.ndim == 3:
        img_ids = img_ids[0]
    runs = runs_by_value(img_ids[:, 0])
    (_, target), references = runs[0], [tokens for _, tokens in runs[1:]]
    context_len = sum(r.stop - r.start for r in references)
    if references and not (target.start == 0 or target.stop == img_ids.shape[0]):
        raise ValueError("img_ids: the target tokens (smallest t) must come before or after all reference tokens")
    context_start = text_len + (target.stop if target.start == 0 else 0)
    return TokenSegments(
        text_len,
        target.stop - target.start,
        context_len,
        grid_shape(img_ids[target]),
        grid_shape(img_ids[references[0]]) if references else (0, 0),
        target_start=text_len + target.start,
        context_start=context_start,
        references=tuple(slice(text_len + r.start, text_len + r.stop) for r in references),
    )


class Flux2EditAttention(FamilyEditAttention):
    family = "flux2"

    def processor_class(self, slot) -> type:
        from diffusers.models.transformers.transformer_flux2 import Flux2ParallelSelfAttention

        return (
            Flux2ParallelEditAttnProcessor
            if isinstance(slot.module, Flux2ParallelSelfAttention)
            else Flux2EditAttnProcessor
        )

    def sigma(self, args, kwargs):
        timestep = kwargs.get("timestep", args[2] if len(args) > 2 else None)
        return timestep.flatten()[:1]

    def observe(self, context, module, args, kwargs) -> None:
        hidden = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
        img_ids = kwargs.get("img_ids", args[3] if len(args) > 3 else None)
        context.img_ids = img_ids
        context.segments = flux2_segments(hidden.shape[1], img_ids)

    def project(self, attn, inputs):
        from mmpos.integrations.diffusers.families.flux2 import flux2_project_heads

        hidden_states, encoder_hidden_states = inputs["hidden_states"], inputs.get("encoder_hidden_states")
        if "encoder_hidden_states" not in inputs:  # parallel single block: fused QKV + MLP input
            return _parallel_project(attn, hidden_states)
        return (*flux2_project_heads(attn, hidden_states, encoder_hidden_states), None)

    def rotary_emb(self, inputs):
        return inputs["image_rotary_emb"]

    def rotation(self, beneath, rotary_emb, layer: int) -> LayerRotation:
        wrapped = getattr(getattr(beneath, "rotation", None), "rotation", None)
        if isinstance(wrapped, EncodingRotation):  # set_pe: (packed [S, G, 2P], coords) of the joint sequence
            packed, coords = rotary_emb
            return LayerRotation((packed[None], coords), wrapped, layer)
        return LayerRotation(rotary_emb)

    def key_mask(self, inputs, segments, batch, length):
        if inputs.get("attention_mask") is not None:
            raise NotImplementedError("edits on FLUX.2 do not support an attention_mask")
        return None

    def finish(self, attn, inputs, state, out, dtype):
        hidden_states = out.flatten(2, 3).to(dtype)
        if "encoder_hidden_states" not in inputs:
            hidden_states = torch.cat([hidden_states, attn.mlp_act_fn(state)], dim=-1)
            return attn.to_out(hidden_states)
        from mmpos.integrations.diffusers.families.flux2 import flux2_finish_attention

        return flux2_finish_attention(attn, hidden_states, inputs["encoder_hidden_states"])

    def image_coords(self, inputs):
        """``img_ids (t, h, w, l)``: the target at ``t = 0``, reference images at ``t = 10, 20, ...``."""
        ids = inputs["img_ids"]
        return (ids[0] if ids.ndim == 3 else ids).float()

    def table_at(self, transformer, inputs, image_coords):
        txt_ids = inputs["txt_ids"]
        text = transformer.pos_embed(txt_ids[0] if txt_ids.ndim == 3 else txt_ids)
        image = transformer.pos_embed(image_coords)
        return tuple(torch.cat([t, i], dim=0) for t, i in zip(text, image))

    def layer_table(self, rotation, emb):
        if isinstance(rotation.rotation, EncodingRotation):  # set_pe: (packed [S, G, 2P], coords)
            packed, coords = emb
            return rotation.table_of((packed[None], coords))
        return rotation.table_of(emb)

    def grid_coords(self, ids, grid):
        return flux2_canvas_ids(ids)

    def move_ids(self, kwargs, coords, grid):
        """The output image's tokens (``t = 0``) of ``img_ids [B, S, 4]`` get ``coords`` of their grid cell, found
        by their ``(h, w)``, not their place in the sequence (condition images keep theirs); the rewritten ids are
        fp32 (the pipelines' are int64, which would truncate fractional positions; ``Flux2PosEmbed`` reads
        ``ids.float()``, so the untouched rows give the same tables)."""
        native = kwargs["img_ids"]
        flat = native[0] if native.ndim == 3 else native  # the model reads the first sample's ids (shared)
        image = flat[:, 0] == 0
        cells = grid_cells(flat[image][:, 1:3], grid)
        if cells.numel() != grid[0] * grid[1]:
            raise ValueError(
                f"img_ids hold {cells.numel()} canvas tokens (t = 0); the {grid[0]}x{grid[1]} canvas has one per cell"
            )
        rewritten = flat.to(torch.float32, copy=True)
        rewritten[image] = coords.to(flat.device)[cells]
        if native.ndim == 3:
            rewritten = rewritten.expand(native.shape[0], -1, -1)
        return {**kwargs, "img_ids": rewritten}


def _parallel_project(attn, hidden_states):
    """``Flux2ParallelSelfAttnProcessor``'s projection: q, k, v ``[B, S, H, D]`` and the MLP input."""
    hidden_states = attn.to_qkv_mlp_proj(hidden_states)
    qkv_dim, mlp_dim = 3 * attn.inner_dim, attn.mlp_hidden_dim * attn.mlp_mult_factor
    local_qkv = hidden_states.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
    qkv, mlp_hidden_states = torch.split(hidden_states, [local_qkv, hidden_states.shape[-1] - local_qkv], dim=-1)
    query, key, value = (t.unflatten(-1, (-1, attn.head_dim)) for t in qkv.chunk(3, dim=-1))
    return attn.norm_q(query), attn.norm_k(key), value, mlp_hidden_states


ADAPTER = Flux2EditAttention()


def flux2_canvas_ids(ids: torch.Tensor) -> torch.Tensor:
    """FLUX.1-style grid ids ``[N, 3]`` ``(0, row, col)`` -> FLUX.2 ``[N, 4]`` ``(0, row, col, 0)`` (fp32)."""
    out = torch.zeros(ids.shape[0], 4, dtype=torch.float32, device=ids.device)
    out[:, 1:3] = ids[:, 1:3].float()
    return out
