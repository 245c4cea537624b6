"""FLUX.2 (dev, Klein; ``Flux2Transformer2DModel``): four axes ``(t, h, w, l)``, theta 2000, ``Flux2PosEmbed``.

Tier 2: ``"native"`` (and its spectrum options) rebuilds the stock tables and keeps the stock processors; any
other rotary encoding runs through :class:`Flux2PEAttnProcessor` / :class:`Flux2PEParallelSelfAttnProcessor`.

The model calls ``pos_embed`` twice per forward, on ``img_ids [S_img, 4]`` and on ``txt_ids [S_txt, 4]``; each
call returns ``(cos, sin)`` ``[S, 128]`` float32 (fp64 phases, pairs repeated). Reference images of the edit
models are concatenated to the image tokens with ``t = 10, 20, ...``; the output image has ``t = 0``. A schedule
reads its scale from the output image's rows and columns (its extent); reference tokens get the same spectrum.
Text ids are ``(0, 0, 0, l)``: extent 1 on the image axes, so text stays on the training spectrum.

Context parallelism (diffusers' plan splits ``img_ids`` and ``txt_ids`` along the sequence): a scheduled encoding
measures each call's extents on the whole ``img_ids`` / ``txt_ids`` the call's shard is part of
(:func:`..global_extents.global_source`), never on the shard.
"""

from __future__ import annotations

import torch

from ....ops.tables import RotaryTable, device_has_fp64
from ..global_extents import global_source
from ..positions import PositionSeam, pack_tables
from ..processors import PEProcessor, processors_beneath
from . import register_family
from .base import Family, extents_of
from .codecs import cos_sin_repeated


def flux2_tables(seam, ids: torch.Tensor):
    if ids.dim() != 2 or ids.shape[-1] < len(seam.axes_dims):
        raise ValueError(f"ids have shape {tuple(ids.shape)}; expected [S, {len(seam.axes_dims)}] (t, h, w, l)")
    pos = ids.float()
    freqs_dtype = torch.float64 if device_has_fp64(ids.device) else torch.float32
    if seam.scheduled and torch.compiler.is_compiling():  # the spectrum the hooks published (flux2_image_extents)
        return seam.published_tables(
            pos[:, 1:3], lambda spectra: cos_sin_repeated(pos, spectra, seam.axes_dims, seam.theta, freqs_dtype)
        )
    extents = None
    if seam.scheduled and pos.shape[0]:  # the output image (t = 0) gives the scale, not the references
        source = global_source(seam, ids)  # under context parallelism: the whole ids this shard is part of
        whole = pos if source is None else source.float()
        extents = extents_of(whole[whole[:, 0] == whole[:, 0].min()])
    spectra = seam.axis_spectra(extents=extents)
    return cos_sin_repeated(pos, spectra, seam.axes_dims, seam.theta, freqs_dtype)


# ---- tier 2: any rotary encoding through mmpos processors ---------------------------------------------------------
class Flux2Positions(PositionSeam):
    """Replaces ``pos_embed`` for an mmpos encoding: each call (``img_ids``, then ``txt_ids``) returns
    ``(packed tables [S, G, 2P], coords [S, A])``, sequence first, so that the model's ``torch.cat`` of the text
    and image halves along dim 0 gives the joint sequence's tables (a table is per token: the tables of a
    concatenation are the concatenation of the tables)."""

    def forward(self, ids: torch.Tensor):
        self.count_forward()
        if ids.dim() != 2:
            raise ValueError(f"ids have shape {tuple(ids.shape)}; expected [S, 4] (t, h, w, l)")
        coords = ids.float()
        if not self.encodings:
            return None
        undo = self.whole_extents(ids)
        try:
            tables = self.tables(coords, self.run_dtype(torch.float32, coords.device))
        finally:
            for pe, previous in undo:
                pe.step.restore_extents(previous)
        if not all(isinstance(t, RotaryTable) for t in tables):
            raise TypeError(
                "FLUX.2 concatenates the text and image tables: the encoding must give rotary tables "
                f"(got {[type(t).__name__ for t in tables]})"
            )
        return pack_tables(tables)[0], coords

    def whole_extents(self, ids) -> list:
        """Scheduled encodings read their extents on the whole ids this call's are part of (this forward's
        ``global_inputs``); returns the ``(encoding, previous extents)`` to put back."""
        source = global_source(self, ids)
        if source is None:
            return []
        scheduled = [pe for pe in self.encodings if getattr(pe, "schedule", None) is not None]
        coords = self.encoding_coords(source.float())
        return [(pe, pe.step.swap_extents(pe.coordinate_extents(coords))) for pe in scheduled]


def flux2_global_inputs(seam, args, kwargs):
    """``(img_ids, txt_ids)`` as the seam gets them in one process (``[S, 4]``; the model takes ``ids[0]`` of
    batched ids), before the context-parallel plan splits them; ``None`` when either is missing."""
    ids = [
        kwargs.get(name, args[index] if len(args) > index else None) for name, index in (("img_ids", 3), ("txt_ids", 4))
    ]
    if not all(isinstance(i, torch.Tensor) for i in ids):
        return None
    return tuple(i[0] if i.dim() == 3 else i for i in ids)


def flux2_image_extents(args, kwargs):
    """The output image's (``t`` = its least value) extent per axis in a forward's ``img_ids``, as
    :func:`flux2_tables` reads it; ``None`` without ``img_ids``."""
    ids = kwargs.get("img_ids", args[3] if len(args) > 3 else None)
    if not isinstance(ids, torch.Tensor) or not ids.shape[-2]:
        return None
    ids = (ids[0] if ids.dim() == 3 else ids).float()
    return extents_of(ids[ids[:, 0] == ids[:, 0].min()])


def flux2_bundle_tables(model, args, kwargs, bundle):
    """SPA's tables (:attr:`Family.bundle_tables`): ``pos_embed`` on ``txt_ids`` and on ``img_ids`` with the rows and
    columns of each of ``bundle``'s grids (reference images bundled with the output image), concatenated text first
    as the model does; the same for every layer."""
    ids = [
        kwargs.get(name, args[index] if len(args) > index else None) for name, index in (("txt_ids", 4), ("img_ids", 3))
    ]
    if not all(isinstance(i, torch.Tensor) for i in ids):
        raise ValueError("spa on FLUX.2 needs txt_ids and img_ids")
    text, image = (i[0] if i.dim() == 3 else i for i in ids)
    position = model.pos_embed
    text_table = position(text)
    tables = []
    for grid in bundle(image[:, 1:3].round()):
        image_table = position(torch.cat([image[:, :1], grid.to(image.dtype), image[:, 3:]], dim=1))
        tables.append(tuple(torch.cat([t, i], dim=0) for t, i in zip(text_table, image_table)))
    return lambda layer: tables


def _attention(model):
    from diffusers.models.transformers.transformer_flux2 import Flux2Attention, Flux2ParallelSelfAttention

    return [
        (name, m) for name, m in model.named_modules() if isinstance(m, (Flux2Attention, Flux2ParallelSelfAttention))
    ]


def _stock_processors():
    from diffusers.models.transformers.transformer_flux2 import Flux2AttnProcessor, Flux2ParallelSelfAttnProcessor

    return (Flux2AttnProcessor, Flux2ParallelSelfAttnProcessor)


def _seam(model, stock, encodings, native, coord_axes):
    return Flux2Positions(encodings, native, coord_axes)


class _Flux2Rotation:
    """The encoding's rotation on the model's concatenated ``(packed [S, G, 2P], coords)``."""

    def __init__(self, rotation):
        self.rotation = rotation

    def __call__(self, query, key, rotary_emb, layer):
        packed, coords = rotary_emb
        return self.rotation(query, key, (packed[None], coords), layer)


def flux2_project_heads(attn, hidden_states, encoder_hidden_states):
    """q, k, v ``[B, S, H, D]`` of a FLUX.2 double block as ``Flux2AttnProcessor`` forms them (normed, before
    RoPE; text first when the block has added projections)."""
    from diffusers.models.transformers.transformer_flux2 import _get_qkv_projections

    query, key, value, encoder_query, encoder_key, encoder_value = _get_qkv_projections(
        attn, hidden_states, encoder_hidden_states
    )
    query = attn.norm_q(query.unflatten(-1, (-1, attn.head_dim)))
    key = attn.norm_k(key.unflatten(-1, (-1, attn.head_dim)))
    value = value.unflatten(-1, (-1, attn.head_dim))
    if attn.added_kv_proj_dim is not None:
        query = torch.cat([attn.norm_added_q(encoder_query.unflatten(-1, (-1, attn.head_dim))), query], dim=1)
        key = torch.cat([attn.norm_added_k(encoder_key.unflatten(-1, (-1, attn.head_dim))), key], dim=1)
        value = torch.cat([encoder_value.unflatten(-1, (-1, attn.head_dim)), value], dim=1)
    return query, key, value


def flux2_finish_attention(attn, hidden_states, encoder_hidden_states):
    """A FLUX.2 double block's attention output ``[B, S, H * D]`` split into text and image and projected, as
    ``Flux2AttnProcessor`` returns it."""
    if encoder_hidden_states is not None:
        text = encoder_hidden_states.shape[1]
        encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
            [text, hidden_states.shape[1] - text], dim=1
        )
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
    hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
    return hidden_states if encoder_hidden_states is None else (hidden_states, encoder_hidden_states)


class Flux2PEAttnProcessor(PEProcessor):
    """``Flux2AttnProcessor`` (double stream: text then image, ``[B, S, H, D]``) with the rotation from mmpos."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        query, key, value = flux2_project_heads(attn, hidden_states, encoder_hidden_states)
        hidden_states = self._rotate_attend(query, key, value, image_rotary_emb, attention_mask, self._parallel_config)
        return flux2_finish_attention(attn, hidden_states.flatten(2, 3).to(query.dtype), encoder_hidden_states)


class Flux2PEParallelSelfAttnProcessor(PEProcessor):
    """``Flux2ParallelSelfAttnProcessor`` (single stream: fused QKV + MLP) with the rotation from mmpos."""

    def __call__(self, attn, hidden_states, attention_mask=None, image_rotary_emb=None):
        hidden_states = attn.to_qkv_mlp_proj(hidden_states)
        qkv_dim, mlp_dim = 3 * attn.inner_dim, attn.mlp_hidden_dim * attn.mlp_mult_factor
        local_qkv = hidden_states.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
        qkv, mlp_hidden_states = torch.split(hidden_states, [local_qkv, hidden_states.shape[-1] - local_qkv], dim=-1)
        query, key, value = (t.unflatten(-1, (-1, attn.head_dim)) for t in qkv.chunk(3, dim=-1))
        query, key = attn.norm_q(query), attn.norm_k(key)
        hidden_states = self._rotate_attend(query, key, value, image_rotary_emb, attention_mask, self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        hidden_states = torch.cat([hidden_states, attn.mlp_act_fn(mlp_hidden_states)], dim=-1)
        return attn.to_out(hidden_states)


def _processors(beneath, rotation, native):
    double, _ = _stock_processors()
    return processors_beneath(
        beneath,
        _Flux2Rotation(rotation),
        lambda stock: Flux2PEAttnProcessor if isinstance(stock, double) else Flux2PEParallelSelfAttnProcessor,
    )


FLUX2 = register_family(
    Family(
        name="flux2",
        classes=("diffusers.models.transformers.transformer_flux2:Flux2Transformer2DModel",),
        position_attr="pos_embed",
        axis_names=("t", "row", "col", "l"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.axes_dims_rope),
        native_theta=lambda model: float(model.config.rope_theta),
        image_axes=(1, 2),
        tables=flux2_tables,  # native: the stock processors stay
        tier=2,  # any other rotary encoding: mmpos processors
        attention_modules=_attention,
        stock_processor=_stock_processors,
        make_processors=_processors,
        make_seam=_seam,
        timestep_per_sigma=1.0,  # the pipelines pass t / 1000; the model multiplies by 1000
        timestep_arg=("timestep", 2),
        global_coords=flux2_global_inputs,
        image_extents=flux2_image_extents,
        bundle_tables=flux2_bundle_tables,
        context_parallel=True,  # tests/integrations/test_context_parallel.py
        pipelines=("Flux2Pipeline", "Flux2KleinPipeline", "Flux2KleinInpaintPipeline"),
        train_size=1024,
        pixels_per_token=16,
        notes="any rotary encoding (native: stock processors); reference images at t = 10, 20, ...; scale from the "
        "output image",
    )
)
