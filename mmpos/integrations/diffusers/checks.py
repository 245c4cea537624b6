"""Checks ``set_pe`` makes on a model, and the pre-forward hook that checks each forward's inputs."""
from __future__ import annotations

import torch

from .models import ModelSpec
from .positions import IdsPrecisionCheck


def check_no_sharded_seam(transformer, spec: ModelSpec) -> None:
    """Wan's context-parallel plan hooks the position module itself: swapping it afterwards would drop the hook
    (tables unsharded while tokens are). Flux's plan shards the model inputs, so it does not matter there."""
    if spec.family == "wan" and getattr(transformer, "_parallel_config", None) is not None:
        raise RuntimeError("WanTransformer3DModel: call set_pe/restore before enable_parallelism (its context-"
                           "parallel plan hooks the `rope` module that set_pe replaces)")


def check_stock_processors(processors, spec: ModelSpec) -> None:
    """Refuse to replace processors (``(layer name, processor)`` pairs: what runs beneath the encoding level) that
    carry more than the stock one (IP-Adapter, custom code)."""
    stock_cls = spec.stock_processor()
    for name, processor in processors:
        if type(processor) is not stock_cls:
            extra = " (an IP-Adapter: its image-prompt term would be lost; unload_ip_adapter() first)" if hasattr(
                processor, "to_k_ip") else " (its extra behaviour would be lost)"
            raise TypeError(f"{name} uses {type(processor).__name__}; set_pe replaces only the stock "
                            f"{stock_cls.__name__}{extra}. Reset it first, e.g. transformer.set_attn_processor(...) "
                            "with the stock processors")


def check_coord_axes(coord_axes, spec: ModelSpec):
    if coord_axes is None:
        return None
    num_axes = len(spec.axis_names)
    axes = tuple(coord_axes)
    if not axes or any(not isinstance(a, int) or not 0 <= a < num_axes for a in axes) or len(set(axes)) != len(axes):
        raise ValueError(f"coord_axes={coord_axes!r}: expected distinct indices into the {spec.family} coordinate "
                         f"axes {spec.axis_names}")
    return axes


def pe_pre_forward_hook(spec: ModelSpec):
    """Record the activation dtype for the seam, set the step's sigma on scheduled encodings (DyPE) from the
    ``timestep`` argument and, on Flux, check that the ids match the tokens."""
    check_precision = IdsPrecisionCheck()

    def hook(module, args, kwargs):
        hidden_states = kwargs.get("hidden_states", args[0] if args else None)
        seam = getattr(module, spec.position_attr)
        if isinstance(hidden_states, torch.Tensor):
            seam.activation_dtype = hidden_states.dtype
        set_step_sigma(seam, kwargs.get("timestep"), spec)
        if spec.family == "flux":
            check_flux_ids(hidden_states, kwargs.get("encoder_hidden_states", _positional(args, 1)),
                            kwargs.get("img_ids", _positional(args, 4)), kwargs.get("txt_ids", _positional(args, 5)),
                            check_precision)
        return None

    return hook


def _positional(args, index):
    return args[index] if len(args) > index else None


def check_flux_ids(hidden_states, encoder_hidden_states, img_ids, txt_ids, check_precision):
    pairs = (("img_ids", img_ids, "hidden_states", hidden_states),
             ("txt_ids", txt_ids, "encoder_hidden_states", encoder_hidden_states))
    for ids_name, ids, tokens_name, tokens in pairs:
        if not isinstance(ids, torch.Tensor) or not isinstance(tokens, torch.Tensor):
            continue
        check_precision(ids_name, ids)
        count = ids.shape[-2] if ids.dim() >= 2 else -1
        if count != tokens.shape[1]:
            raise ValueError(f"{ids_name} has shape {tuple(ids.shape)} ({count} positions) but {tokens_name} has "
                             f"{tokens.shape[1]} tokens; expected [{tokens.shape[1]}, 3]")


def set_step_sigma(seam, timestep, spec: ModelSpec) -> None:
    """``encoding.step.sigma = timestep / spec.timestep_per_sigma`` for every encoding whose schedule follows the
    diffusion time (one device sync per forward, only for those); ``None`` when no timestep is passed."""
    steps = [pe.step for pe in seam.encodings
             if getattr(pe, "schedule", None) is not None and pe.schedule.dynamic]
    if not steps:
        return
    sigma = None
    if isinstance(timestep, torch.Tensor) and timestep.numel():
        sigma = float(timestep.flatten()[0]) / spec.timestep_per_sigma
    for step in steps:
        step.sigma = sigma
