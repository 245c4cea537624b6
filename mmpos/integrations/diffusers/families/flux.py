"""FLUX.1 (``FluxTransformer2DModel``: dev, schnell, Fill, Kontext): ``FluxPosEmbed`` on ``ids [S, 3]``.

Tier 2: the seam (:class:`FluxPositions`) and mmpos processors (:class:`FluxPEAttnProcessor`), so any rotary
encoding, the camera adapters and the edits install. Axes ``(index, row,
col)``: text ids are zeros, Kontext's context image has index 1.

An IP-Adapter composes in either order: ``set_pe`` over ``load_ip_adapter`` carries each layer's
``FluxIPAdapterAttnProcessor`` in a :class:`FluxPEIPAdapterAttnProcessor`, and ``load_ip_adapter`` /
``unload_ip_adapter`` after ``set_pe`` are taken back at the next forward, edit or ``restore``
(:func:`flux_rebind_processor`).
"""

from __future__ import annotations

import weakref

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers import transformer_flux
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor, FluxIPAdapterAttnProcessor
from torch import nn

from ..positions import PositionSeam
from ..processors import PEProcessor, processors_beneath
from . import register_family
from .base import Family


class FluxPositions(PositionSeam):
    """Replaces ``FluxTransformer2DModel.pos_embed``: ``ids [S, 3]`` (text then image) -> tables.

    ``ids_precision`` checks the forward's 16-bit ids once per ids tensor (the family's input check)."""

    def __init__(self, encodings, native, coord_axes):
        super().__init__(encodings, native, coord_axes)
        self.ids_precision = IdsPrecisionCheck()

    def forward(self, ids: torch.Tensor):
        self.count_forward()
        coords = flux_coords(ids)
        if not self.encodings:
            return None
        if self.native:
            return self.native_cos_sin(coords, torch.float32, coords.device)
        return self.tables(coords, self.run_dtype(torch.float32, coords.device))


def flux_coords(ids: torch.Tensor) -> torch.Tensor:
    """Flux ids ``[S, A]`` as fp32 coordinates, as the stock ``FluxPosEmbed`` reads them."""
    if ids.dim() != 2:
        raise ValueError(f"ids have shape {tuple(ids.shape)}; expected [S, num_axes]")
    return ids.float()


class IdsPrecisionCheck:
    """Refuse 16-bit ids that lost positions (bf16 holds integers exactly only up to 256, fp16 up to 2048).

    Reading the maximum synchronises with the device, so each ids tensor is checked once: pipelines pass the
    same ids object at every step.
    """

    def __init__(self):
        self._checked: dict[str, tuple] = {}

    def __call__(self, name: str, ids: torch.Tensor) -> None:
        if ids.dtype not in (torch.float16, torch.bfloat16):
            return
        seen = self._checked.get(name)
        if seen is not None and seen[0]() is ids and seen[1] == ids._version:
            return
        exact = 256 if ids.dtype == torch.bfloat16 else 2048
        if ids.numel() and ids.abs().max().item() > exact:
            raise ValueError(
                f"{name} is {ids.dtype} with positions above {exact}, which that dtype rounds; build the ids in float32"
            )
        self._checked[name] = (weakref.ref(ids), ids._version)


def flux_stock_rotation(query, key, rotary_emb, layer):
    return apply_rotary_emb(query, rotary_emb, sequence_dim=1), apply_rotary_emb(key, rotary_emb, sequence_dim=1)


def flux_project_heads(attn, hidden_states, encoder_hidden_states=None):
    """q, k, v as ``[B, S, H, D]`` after qk-norm, text prepended in double blocks; RoPE not yet applied.

    Same operations, in the same order, as diffusers' ``FluxAttnProcessor``.
    """
    return flux_project_heads_and_image_query(attn, hidden_states, encoder_hidden_states)[:3]


def flux_project_heads_and_image_query(attn, hidden_states, encoder_hidden_states=None):
    """:func:`flux_project_heads` and the image tokens' queries ``[B, S_img, H, D]`` after qk-norm (what the
    IP-Adapter term attends from)."""
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
        image_query = query
        query = torch.cat([encoder_query, query], dim=1)
        key = torch.cat([encoder_key, key], dim=1)
        value = torch.cat([encoder_value, value], dim=1)
        return query, key, value, image_query
    return query, key, value, query


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


class FluxPEAttnProcessor(PEProcessor):
    """``FluxAttnProcessor`` with the rotation from mmpos (joint text+image sequence, ``[B, S, H, D]``)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        query, key, value = flux_project_heads(attn, hidden_states, encoder_hidden_states)
        hidden_states = self._rotate_attend(query, key, value, image_rotary_emb, attention_mask, self._parallel_config)
        return flux_finish_attention(attn, hidden_states, encoder_hidden_states, query.dtype)


class FluxPEIPAdapterAttnProcessor(FluxPEAttnProcessor, FluxIPAdapterAttnProcessor):
    """``FluxIPAdapterAttnProcessor`` with the rotation from mmpos: the joint attention rotated as in
    :class:`FluxPEAttnProcessor`, plus the image-prompt term as the stock processor computes it (from the image
    queries before the rotation, without positions). It carries the stock processor it replaces (:meth:`carry`): the
    IP-Adapter's ``to_k_ip`` / ``to_v_ip`` are the same modules and ``scale`` is the stock one's, so
    ``set_ip_adapter_scale`` reaches both and ``restore`` puts back the stock processor as it is."""

    def __init__(self, rotation=None, layer: int | None = None, attention_backend=None, parallel_config=None):
        nn.Module.__init__(self)
        FluxPEAttnProcessor.__init__(self, rotation, layer, attention_backend, parallel_config)
        self.__dict__["carried"] = None  # the stock processor (not a submodule: its layers are registered here)

    def carry(self, stock: FluxIPAdapterAttnProcessor) -> "FluxPEIPAdapterAttnProcessor":
        self.__dict__["carried"] = stock
        self.to_k_ip, self.to_v_ip = stock.to_k_ip, stock.to_v_ip
        return self

    @property
    def scale(self):
        return self.carried.scale

    @scale.setter
    def scale(self, value):
        self.carried.scale = value

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        attention_mask=None,
        image_rotary_emb=None,
        ip_hidden_states=None,
        ip_adapter_masks=None,  # taken and unused, as by the stock processor
    ):
        query, key, value, image_query = flux_project_heads_and_image_query(attn, hidden_states, encoder_hidden_states)
        if image_rotary_emb is not None:
            query, key = self.rotation(query, key, image_rotary_emb, self.layer)
        hidden_states = self._attend(query, key, value, attention_mask, self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is None:
            return hidden_states
        text_len = encoder_hidden_states.shape[1]
        encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
            [text_len, hidden_states.shape[1] - text_len], dim=1
        )
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))  # no .contiguous(): as the stock IP processor
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        if ip_hidden_states is None:  # a forward without image-prompt embeddings: no image-prompt term
            return hidden_states, encoder_hidden_states
        return hidden_states, encoder_hidden_states, self.image_prompt(attn, image_query, ip_hidden_states)

    def image_prompt(self, attn, image_query, ip_hidden_states):
        """The IP-Adapter term ``[B, S_img, H * D]``: per adapter, ``scale`` times the attention from the image
        queries to its image-prompt tokens."""
        batch = image_query.shape[0]
        total = 0
        for states, scale, to_k, to_v in zip(ip_hidden_states, self.scale, self.to_k_ip, self.to_v_ip):
            ip_key = to_k(states).view(batch, -1, attn.heads, attn.head_dim)
            ip_value = to_v(states).view(batch, -1, attn.heads, attn.head_dim)
            out = dispatch_attention_fn(
                image_query,
                ip_key,
                ip_value,
                backend=self._attention_backend,
                parallel_config=self._parallel_config,
            )
            total = total + scale * out.reshape(batch, -1, attn.heads * attn.head_dim).to(image_query.dtype)
        return total


def flux_attention_modules(model):
    from diffusers.models.transformers.transformer_flux import FluxAttention

    return [(name, m) for name, m in model.named_modules() if isinstance(m, FluxAttention)]


def flux_stock_processor():
    return FluxAttnProcessor


def flux_seam(model, stock, encodings, native, coord_axes):
    return FluxPositions(encodings, native, coord_axes)


def flux_processors(beneath, rotation, native):
    """Per layer a :class:`FluxPEAttnProcessor`, or a :class:`FluxPEIPAdapterAttnProcessor` carrying the layer's
    IP-Adapter processor."""

    def processor_class(stock):
        return FluxPEIPAdapterAttnProcessor if isinstance(stock, FluxIPAdapterAttnProcessor) else FluxPEAttnProcessor

    processors = processors_beneath(beneath, flux_stock_rotation if native else rotation, processor_class)
    for layer, (_, stock) in enumerate(beneath):
        if isinstance(processors[layer], FluxPEIPAdapterAttnProcessor):
            processors[layer].carry(stock)
    return processors


def flux_rebind_processor(installed, new):
    """After ``set_pe``: ``load_ip_adapter`` put a stock ``FluxIPAdapterAttnProcessor`` on a layer (the mmpos
    processor carrying it replaces it), or ``unload_ip_adapter`` put a stock ``FluxAttnProcessor`` where an IP-Adapter
    was (the plain mmpos processor replaces it); both keep the layer's rotation. Anything else: ``None`` (refused)."""
    if type(new) is FluxIPAdapterAttnProcessor:
        replacement = FluxPEIPAdapterAttnProcessor(*_bound_state(installed)).carry(new)
    elif type(new) is FluxAttnProcessor and isinstance(installed, FluxPEIPAdapterAttnProcessor):
        replacement = FluxPEAttnProcessor(*_bound_state(installed))
    else:
        return None
    return replacement


def _bound_state(processor):
    return processor.rotation, processor.layer, processor._attention_backend, processor._parallel_config


def _positional(args, index):
    return args[index] if len(args) > index else None


def check_flux_ids(seam, args, kwargs) -> None:
    """The ids match the tokens (``img_ids`` vs ``hidden_states``, ``txt_ids`` vs ``encoder_hidden_states``)
    and were not built in a 16-bit dtype that rounds them."""
    check_precision = seam.ids_precision
    hidden_states = kwargs.get("hidden_states", _positional(args, 0))
    pairs = (
        ("img_ids", kwargs.get("img_ids", _positional(args, 4)), "hidden_states", hidden_states),
        (
            "txt_ids",
            kwargs.get("txt_ids", _positional(args, 5)),
            "encoder_hidden_states",
            kwargs.get("encoder_hidden_states", _positional(args, 1)),
        ),
    )
    for ids_name, ids, tokens_name, tokens in pairs:
        if not isinstance(ids, torch.Tensor) or not isinstance(tokens, torch.Tensor):
            continue
        check_precision(ids_name, ids)
        count = ids.shape[-2] if ids.dim() >= 2 else -1
        if count != tokens.shape[1]:
            raise ValueError(
                f"{ids_name} has shape {tuple(ids.shape)} ({count} positions) but {tokens_name} has "
                f"{tokens.shape[1]} tokens; expected [{tokens.shape[1]}, 3]"
            )


def flux_global_coords(seam, args, kwargs):
    """``[txt_ids; img_ids]`` as coordinates (what ``FluxPositions`` gets in one process), or ``None``."""
    ids = [kwargs.get(name, _positional(args, index)) for name, index in (("txt_ids", 5), ("img_ids", 4))]
    if not all(isinstance(i, torch.Tensor) for i in ids):
        return None
    ids = [i[0] if i.dim() == 3 else i for i in ids]  # the deprecated batched ids, as the stock forward reads them
    return flux_coords(torch.cat(ids, dim=0))


def flux_bundle_tables(model, args, kwargs, bundle):
    """SPA's tables (:attr:`Family.bundle_tables`): the model's position module on ``[txt_ids; img_ids]`` with the
    image rows and columns of each of ``bundle``'s grids, the same for every layer (FLUX.1, Chroma)."""
    ids = [kwargs.get(name) for name in ("txt_ids", "img_ids")]
    if not all(isinstance(i, torch.Tensor) for i in ids):
        raise ValueError("spa on FLUX.1 / Chroma needs txt_ids and img_ids passed by name, as the pipelines do")
    text, image = (i[0] if i.dim() == 3 else i for i in ids)
    position = getattr(model, "pos_embed")
    tables = [position(torch.cat([text, torch.cat([image[:, :1], g], dim=1)])) for g in bundle(image[:, 1:3].round())]
    return lambda layer: tables


FLUX = register_family(
    Family(
        name="flux",
        classes=("diffusers.models.transformers.transformer_flux:FluxTransformer2DModel",),
        position_attr="pos_embed",
        axis_names=("index", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.axes_dims_rope),
        native_theta=lambda model: float(model.pos_embed.theta),
        image_axes=(1, 2),
        timestep_per_sigma=1.0,  # the Flux pipelines pass t / 1000 = sigma
        timestep_arg=("timestep", 3),
        tier=2,
        attention_modules=flux_attention_modules,
        stock_processor=flux_stock_processor,
        make_processors=flux_processors,
        composes_with=lambda: (FluxIPAdapterAttnProcessor,),
        rebind_processor=flux_rebind_processor,
        make_seam=flux_seam,
        check_inputs=check_flux_ids,
        global_coords=flux_global_coords,
        bundle_tables=flux_bundle_tables,
        context_parallel=True,  # tests/integrations/test_context_parallel.py
        pipelines=("FluxPipeline", "FluxFillPipeline", "FluxKontextPipeline"),
        train_size=1024,
        pixels_per_token=16,
        notes="any rotary encoding; the edits (band, transplant, LooseRoPE); Kontext's context image at index 1",
    )
)
