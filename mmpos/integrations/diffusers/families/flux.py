"""FLUX.1 (``FluxTransformer2DModel``: dev, schnell, Fill, Kontext): ``FluxPosEmbed`` on ``ids [S, 3]``.

Tier 2: the seam (:class:`~..positions.FluxPositions`) and mmpos processors (:class:`~..processors.
FluxPEAttnProcessor`), so any rotary encoding, the camera adapters and the edits install. Axes ``(index, row,
col)``: text ids are zeros, Kontext's context image has index 1.
"""

from __future__ import annotations

import torch

from ..positions import FluxPositions, flux_coords
from . import register_family
from .base import Family


def flux_attention_modules(model):
    from diffusers.models.transformers.transformer_flux import FluxAttention

    return [(name, m) for name, m in model.named_modules() if isinstance(m, FluxAttention)]


def flux_stock_processor():
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    return FluxAttnProcessor


def flux_seam(model, stock, encodings, native, coord_axes):
    return FluxPositions(encodings, native, coord_axes)


def flux_processors(beneath, rotation, native):
    from ..processors import FluxPEAttnProcessor, flux_stock_rotation, processors_beneath

    return processors_beneath(beneath, flux_stock_rotation if native else rotation, lambda _: FluxPEAttnProcessor)


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
        make_seam=flux_seam,
        check_inputs=check_flux_ids,
        global_coords=flux_global_coords,
        context_parallel=True,  # tests/integrations/test_context_parallel.py
        pipelines=("FluxPipeline", "FluxFillPipeline", "FluxKontextPipeline"),
        train_size=1024,
        pixels_per_token=16,
        notes="any rotary encoding; the edits (band, transplant, LooseRoPE); Kontext's context image at index 1",
    )
)
