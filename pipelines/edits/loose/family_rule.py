"""LooseRoPE on the edit seam: FLUX.2 Klein's edit mode and Qwen-Image-Edit(-Plus).

The rule is FLUX.1 Kontext's (:mod:`.rule`: saliency bins of the paste's output-image queries, loosened
positions toward the target's centre for their logits to the collage's tokens, a logit factor on the collage's
pasted tokens) written against one attention layer call of any family (:class:`~mmpos.pipelines.edits.families.LayerCall`). What is
per family is here, in a :class:`LoosePositions`:

* the coordinates of this forward's image tokens (FLUX.2: ``img_ids (t, h, w, l)``; Qwen-Image: its centred
  ``(frame, row, col)`` from ``img_shapes``), read from the transformer's inputs;
* the rotary embedding the model's position module gives other coordinates, in the joint format the layer reads
  (FLUX.2: ``pos_embed`` on the shrunk ids and on ``txt_ids``, concatenated text first; Qwen-Image: the complex
  table of :func:`~mmpos.pipelines.edits.transplant.positions.qwen_table_at`, text table first).

The stock attention is computed only for the queries no bin replaces (the binned ones get the loosened mix).
The output image is the tokens at the smallest frame coordinate (FLUX.2 ``t = 0``, Qwen frame 0), the collage
the first reference image (``t = 10``, frame 1); every token's grid cell is read from its coordinates, so the
paste, the bins and the crop keys do not depend on the order of the tokens in the sequence.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

from mmpos.coords.edits import shrink_ids
from mmpos.integrations.diffusers.families.qwen import qwen_coords
from mmpos.integrations.diffusers.layer_rotation import LayerRotation, sequence_slice
from mmpos.integrations.diffusers.processors import EncodingRotation
from mmpos.ops.tables import RotaryTable

from ..transplant.positions import qwen_table_at
from .rule import LooseConfig, LooseMaps, token_maps


class ForwardInputs:
    """Pre-forward hook recording the transformer's keyword inputs of the current forward (``.kwargs``)."""

    def __init__(self):
        self.kwargs: dict = {}

    def __call__(self, module, args, kwargs):
        self.kwargs = kwargs
        return None


class LoosePositions:
    """A family's coordinates and position module, as the LooseRoPE rule needs them."""

    spatial_axes = (1, 2)

    def image_coords(self, inputs: dict) -> torch.Tensor:
        """``[S_img, A]`` fp32 coordinates of the image tokens, in sequence order."""
        raise NotImplementedError

    def joint_emb(self, transformer, inputs: dict, image_coords: torch.Tensor):
        """The rotary embedding of ``[text | image tokens at image_coords]`` in the layers' format."""
        raise NotImplementedError

    def layer_table(self, rotation: LayerRotation, emb) -> RotaryTable:
        return rotation.table_of(emb)


class Flux2Positions(LoosePositions):
    def image_coords(self, inputs):
        ids = inputs["img_ids"]
        return (ids[0] if ids.ndim == 3 else ids).float()

    def joint_emb(self, transformer, inputs, image_coords):
        txt_ids = inputs["txt_ids"]
        text = transformer.pos_embed(txt_ids[0] if txt_ids.ndim == 3 else txt_ids)
        image = transformer.pos_embed(image_coords)
        return tuple(torch.cat([t, i], dim=0) for t, i in zip(text, image))

    def layer_table(self, rotation, emb):
        if isinstance(rotation.rotation, EncodingRotation):  # set_pe: (packed [S, G, 2P], coords)
            packed, coords = emb
            return rotation.table_of((packed[None], coords))
        return rotation.table_of(emb)


class QwenPositions(LoosePositions):
    def image_coords(self, inputs):
        return qwen_coords(inputs["img_shapes"], 1, inputs["hidden_states"].device)[0]

    def joint_emb(self, transformer, inputs, image_coords):
        text_len = inputs["encoder_hidden_states"].shape[1]
        _, text = transformer.pos_embed(inputs["img_shapes"], max_txt_seq_len=text_len, device=image_coords.device)
        return RotaryTable(torch.cat([text, qwen_table_at(transformer.pos_embed, image_coords)], dim=0))


POSITIONS = {"flux2": Flux2Positions(), "qwen": QwenPositions()}


def grid_cells(coords: torch.Tensor, axes=(1, 2)) -> tuple[torch.Tensor, tuple[int, int]]:
    """Cell ``row * cols + col`` of each token of one image (``coords [N, A]``, rows and columns counted from their
    minimum) and the grid ``(rows, cols)``; an error unless the tokens fill the grid once each."""
    r = coords[:, axes[0]] - coords[:, axes[0]].min()
    c = coords[:, axes[1]] - coords[:, axes[1]].min()
    rows, cols = int(r.max().round()) + 1, int(c.max().round()) + 1
    cells = r.round().long() * cols + c.round().long()
    if rows * cols != coords.shape[0] or torch.unique(cells).numel() != cells.numel():
        raise ValueError(f"an image's {coords.shape[0]} tokens do not fill a {rows}x{cols} grid once each")
    return cells, (rows, cols)


class FamilyLooseRule:
    """LooseRoPE on one family's layers (see the module docstring); ``inputs`` records the forward's kwargs."""

    def __init__(
        self,
        config: LooseConfig,
        positions: LoosePositions,
        transformer,
        inputs: ForwardInputs,
        saliency: torch.Tensor,
        crop_mask: torch.Tensor,
    ):
        self.config, self.positions, self.transformer, self.inputs = config, positions, transformer, inputs
        self.saliency, self.crop_mask = saliency, crop_mask
        self.maps: Optional[LooseMaps] = None

    def is_active(self, context) -> bool:
        seg = context.segments
        if not self.config.in_range(context.step) or seg is None or not seg.references:
            return False
        return bool(self._bins(context))

    def _layout(self, context):
        """Per forward: target and collage tokens (offsets in the image tokens), their grid cells, the maps."""
        key = ("loose_layout", id(self))
        if key not in context.cache:
            seg = context.segments
            coords = self.positions.image_coords(self.inputs.kwargs)
            start = seg.image_start
            target = torch.arange(seg.target_start - start, seg.target_start - start + seg.target_len)
            collage = seg.references[0]
            collage = torch.arange(collage.start - start, collage.stop - start)
            target_cells, target_grid = grid_cells(coords[target], self.positions.spatial_axes)
            collage_cells, collage_grid = grid_cells(coords[collage], self.positions.spatial_axes)
            if (
                self.maps is None
                or self.maps.bins.shape != target_grid
                or self.maps.context_region.shape != collage_grid
            ):
                self.maps = token_maps(self.config, self.saliency, self.crop_mask, target_grid, collage_grid)
            context.cache[key] = (coords, target, target_cells, collage, collage_cells)
        return context.cache[key]

    def _bins(self, context):
        """Non-identity bins at this step: ``(bin, shrink, logit factor, joint positions of its queries)``."""
        key = ("loose_bins", id(self))
        if key not in context.cache:
            _, target, target_cells, _, _ = self._layout(context)
            shrink, attention = self.config.factors_at(context.step)
            bins = self.maps.bins.flatten()[target_cells]  # the bin of each target token, in sequence order
            out = []
            for b in range(self.config.num_bins):
                tokens = target[bins == b] + context.segments.image_start
                if tokens.numel() and (shrink[b] != 1 or attention[b] != 1):
                    out.append((b, float(shrink[b]), float(attention[b]), tokens))
            context.cache[key] = out
        return context.cache[key]

    def prepare(self, context, transformer) -> None:
        """Per forward: the position module's embedding of each active bin's loosened coordinates."""
        coords, target, _, collage, collage_cells = self._layout(context)
        axes = self.positions.spatial_axes
        low, high = coords[target][:, list(axes)].amin(0), coords[target][:, list(axes)].amax(0)
        centre = tuple(float(v) for v in (low + high) / 2)
        region = self.maps.context_region.flatten()[collage_cells].to(coords.device)  # per collage token
        entries = []
        for b, shrink, factor, tokens in self._bins(context):
            shrunk = shrink_ids(coords, shrink, centre, self.config.quantize_ids_bf16, axes)
            emb = self.positions.joint_emb(self.transformer, self.inputs.kwargs, shrunk)
            entries.append((b, tokens.to(coords.device), emb, torch.where(region, factor, 1.0).float()))
        context.cache["loose"] = entries

    def attend_call(self, call, context):
        query, key, value, rotation = call.query, call.key, call.value, call.rotation
        q_std, k_std = rotation(query), rotation(key)
        rest = self._unbinned(context, query.shape[1], query.device)
        stock = call.attend(q_std[:, rest], k_std, value, call.key_mask)  # the binned queries' rows are replaced
        out = stock.new_empty(*query.shape[:-1], value.shape[-1]).index_copy_(1, rest, stock)
        collage = call.segments.references[0]
        scale = 1.0 / math.sqrt(query.shape[-1])
        standard = torch.cat([k_std, torch.zeros_like(k_std)], dim=-1)
        for b, tokens, emb, key_scale in context.cache["loose"]:
            table = self._table(context, rotation, b, emb)
            q_loose = rotation(query[:, tokens], sequence_slice(table, tokens))
            k_loose = rotation(key[:, collage], sequence_slice(table, collage))
            k_loose = k_loose * key_scale.to(key.dtype)[None, :, None, None]
            k_hat = standard.clone()
            k_hat[:, collage] = torch.cat([torch.zeros_like(k_loose), k_loose], dim=-1)
            q_hat = torch.cat([q_std[:, tokens], q_loose], dim=-1)
            out = out.index_copy(1, tokens, attend_wide(q_hat, k_hat, value, scale, call.key_mask))
        return call.finish(out, query.dtype)

    def _unbinned(self, context, length: int, device) -> torch.Tensor:
        """Joint positions of the queries no active bin replaces (once per forward)."""
        key = ("loose_unbinned", id(self), length)
        if key not in context.cache:
            keep = torch.ones(length, dtype=torch.bool, device=device)
            for _, tokens, _, _ in context.cache["loose"]:
                keep[tokens] = False
            context.cache[key] = keep.nonzero().flatten()
        return context.cache[key]

    def _table(self, context, rotation, bin_index, emb):
        """This layer's table of one bin's loosened embedding (once per forward per table group)."""
        cache_key = ("loose_table", id(rotation.rotation), rotation.index, bin_index)
        cached = context.cache.get(cache_key)
        if cached is None or cached[0] is not emb:
            cached = context.cache[cache_key] = (emb, self.positions.layer_table(rotation, emb))
        return cached[1]


def attend_wide(query, key, value, scale: float, key_mask=None) -> torch.Tensor:
    """PyTorch SDPA of q/k wider than v (v padded with zero channels, dropped again: the fused kernel), with an
    optional ``key_mask [B, S_k]`` bool (True: attend) as the stock processors pass it."""
    width = query.shape[-1] - value.shape[-1]
    padded = torch.cat([value, value.new_zeros(*value.shape[:-1], width)], dim=-1) if width > 0 else value
    mask = None if key_mask is None else key_mask[:, None, None, :]
    out = dispatch_attention_fn(query, key, padded, attn_mask=mask, scale=scale, backend=AttentionBackendName.NATIVE)
    return out[..., : value.shape[-1]]
