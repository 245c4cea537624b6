"""Checks ``set_pe`` makes on a model, and the pre-forward hook that checks each forward's inputs."""

from __future__ import annotations

import torch

from .families import Family
from .families.rotary_input import replace_rotary_input
from .parallelism import check_parallelism


def check_model(transformer, family: Family) -> None:
    """The family's own checks of the model (e.g. Wan: not already context-parallel)."""
    if family.check_model is not None:
        family.check_model(transformer)


def check_stock_processors(processors, family: Family) -> None:
    """Refuse to replace processors (``(layer name, processor)`` pairs: what runs beneath the encoding level) that
    carry more than the stock one (IP-Adapter, custom code)."""
    stock = family.stock_processor()
    stock = stock if isinstance(stock, tuple) else (stock,)
    stock += family.composes_with() if family.composes_with is not None else ()
    for name, processor in processors:
        if type(processor) not in stock:
            extra = (
                " (an IP-Adapter: its image-prompt term would be lost; unload_ip_adapter() first)"
                if hasattr(processor, "to_k_ip")
                else " (its extra behaviour would be lost)"
            )
            raise TypeError(
                f"{name} uses {type(processor).__name__}; set_pe replaces only the stock "
                f"{' / '.join(c.__name__ for c in stock)}{extra}. Reset it first, e.g. transformer.set_attn_processor(...) "
                "with the stock processors"
            )


def check_coord_axes(coord_axes, family: Family):
    if coord_axes is None:
        return None
    num_axes = len(family.axis_names)
    axes = tuple(coord_axes)
    if not axes or any(not isinstance(a, int) or not 0 <= a < num_axes for a in axes) or len(set(axes)) != len(axes):
        raise ValueError(
            f"coord_axes={coord_axes!r}: expected distinct indices into the {family.name} coordinate "
            f"axes {family.axis_names}"
        )
    return axes


def pe_pre_forward_hook(family: Family):
    """Record the activation dtype for the seam, set the step's sigma on scheduled encodings (DyPE) from the
    forward's timestep (:meth:`Family.sigma`), and run the family's input checks; a family whose pipeline passes the
    tables (:attr:`Family.rotary_input`) gets them replaced by the seam's."""

    @torch.compiler.disable  # eager under torch.compile(model): float(timestep), Python state; the graph reads tensors
    def hook(module, args, kwargs):
        check_parallelism(module, "a forward with set_pe", family)
        hidden_states = kwargs.get("hidden_states", args[0] if args else None)
        seam = getattr(module, family.position_attr)
        if isinstance(hidden_states, torch.Tensor):
            seam.activation_dtype = hidden_states.dtype
        set_step_sigma(seam, family, args, kwargs)
        if family.check_inputs is not None:
            family.check_inputs(seam, args, kwargs)
        if family.rotary_input is not None:
            return replace_rotary_input(seam, family, module, args, kwargs)
        return None

    return hook


def set_step_sigma(seam, family: Family, args=(), kwargs=None) -> None:
    """``encoding.step.sigma`` = the forward's sigma for every encoding whose schedule follows the diffusion time
    (one device sync per forward, only for those); ``None`` when no timestep is passed."""
    scheduled = [pe for pe in seam.encodings if getattr(pe, "schedule", None) is not None and pe.schedule.dynamic]
    if not scheduled:
        return
    sigma = family.sigma(args, kwargs or {})
    for pe in scheduled:
        pe.step.sigma = sigma
        if hasattr(pe, "publish_schedule"):  # for a compiled graph (GlobalExtents publishes again with the extents)
            pe.publish_schedule()
