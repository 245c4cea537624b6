"""Encodings for a stack of attention blocks: one shared instance, or one per block.

Used by every backbone integration (timm, the reference DiT): the model supplies facts it knows
(``head_dim``, ``num_heads``, ``num_prefix_tokens``, ...), each encoding takes the ones it accepts, and the
user's options override them. Learnable encodings (``capabilities.learnable``: RoPE-Mixed, ComRoPE, HARoPE) get
one instance per block by default, as in their papers; the others share one instance, so one table serves all
blocks.
"""

from __future__ import annotations

from torch import nn

from .._validation import check_positive_int
from .base import PositionalEncoding
from .registry import create_pe, pe_class, pe_options


def fitting_options(name: str, model_facts: dict, options: dict) -> dict:
    """``model_facts`` restricted to the options encoding ``name`` accepts, overridden by ``options``."""
    accepted = pe_options(name)
    return {**{k: v for k, v in model_facts.items() if k in accepted}, **options}


def create_block_pes(
    name: str,
    num_blocks: int,
    model_facts: dict,
    options: dict | None = None,
    share: bool | None = None,
    where: str = "the model",
) -> list[PositionalEncoding]:
    """One encoding per block (the same object ``num_blocks`` times when shared).

    Args:
        name: registered encoding name.
        num_blocks: attention blocks to serve.
        model_facts: what the model knows, e.g. ``dict(head_dim=64, num_heads=6, num_prefix_tokens=1)``.
        options: the user's encoding options (override the facts).
        share: ``True`` one instance, ``False`` one per block, ``None`` share only encodings that are not
            learnable (``capabilities.learnable``).
            Per-block copies of an encoding seeded by a ``seed`` option get ``seed + block index``.
        where: model description used in error messages.
    """
    check_positive_int("num_blocks", num_blocks)
    pe_class(name)  # unknown names fail here, listing the registered ones
    opts = fitting_options(name, model_facts, dict(options or {}))
    first = _create(name, opts, where)
    if share is None:
        share = not first.capabilities.learnable
    if share:
        return [first] * num_blocks
    pes = [first]
    for index in range(1, num_blocks):
        block_opts = dict(opts)
        if block_opts.get("seed") is not None:
            block_opts["seed"] = block_opts["seed"] + index
        pes.append(_create(name, block_opts, where))
    return pes


def _create(name: str, opts: dict, where: str) -> PositionalEncoding:
    try:
        return create_pe(name, **opts)
    except (ValueError, TypeError) as err:
        raise type(err)(f"encoding {name!r} does not fit {where}: {err}") from err


def check_model_coordinates(pe: nn.Module, where: str) -> None:
    """Raise if ``pe`` jitters its own grid in training (``capabilities.jitters_coords``: ComRoPE ``perturbation`` /
    ``offset_std``): a model that passes its tokens' coordinates would hit that at its first training step, or
    (diffusers tables) ignore it."""
    capabilities = getattr(pe, "capabilities", None)  # objects that are no encoding are rejected by the callers
    if capabilities is not None and capabilities.jitters_coords:
        raise ValueError(
            f"perturbation / offset_std jitter the encoding's own grid in its forward, but {where} "
            "passes its tokens' coordinates: leave them 0 and perturb the coordinates instead "
            "(mmpos.coords.perturb_grid_coords)"
        )


def check_fits(pe: nn.Module, head_dim: int, num_axes: int, where: str) -> None:
    """Raise if ``pe`` was built for another head dim or coordinate axes count than the model has, or jitters
    its own grid (:func:`check_model_coordinates`)."""
    check_model_coordinates(pe, where)
    pe_head_dim = getattr(pe, "head_dim", None)
    if pe_head_dim is not None and pe_head_dim != head_dim:
        raise ValueError(
            f"encoding {pe.pe_name!r} was built for head_dim={pe_head_dim} but {where} has head_dim={head_dim}"
        )
    pe_axes = getattr(pe, "num_axes", num_axes)
    if pe_axes != num_axes:
        raise ValueError(
            f"encoding {pe.pe_name!r} reads {pe_axes} coordinate axes but {where} gives its tokens "
            f"{num_axes} (e.g. (row, col) for images)"
        )


def is_encoding(module: nn.Module) -> bool:
    return hasattr(type(module), "pe_name")


def no_weight_decay_names(model: nn.Module) -> set[str]:
    """Full names of encoding parameters that should not be weight-decayed, as ``model.named_parameters()``
    spells them: each encoding's ``no_weight_decay()``, or all its parameters if it does not say (positional
    tables and frequencies are conventionally not decayed, like timm's ``pos_embed``)."""
    names = set()
    for prefix, module in model.named_modules():
        if is_encoding(module):
            own = (
                module.no_weight_decay()
                if hasattr(module, "no_weight_decay")
                else (n for n, _ in module.named_parameters())
            )
            names |= {f"{prefix}.{p}" if prefix else p for p in own}
    return names
