"""The parameters of a model's positional encodings, and training only those.

One API for every model mmpos puts encodings into: timm ViTs (``mmpos.integrations.timm.convert``), the reference
DiT (``mmpos.models.DiT``) and diffusers transformers after ``set_pe``. Parameters belong to an encoding when
they live in a module created by the registry (RoPE-Mixed frequencies, ComRoPE generators, HARoPE's skew
parameters, learned APE tables, ...). Like ``named_parameters`` / ``parameters``:

    >>> from mmpos.integrations.pe_parameters import named_pe_parameters, train_only_pe
    >>> [name for name, _ in named_pe_parameters(vit)]
    ['blocks.0.attn.pe.freqs', 'blocks.1.attn.pe.freqs', ...]
    >>> optimizer = torch.optim.AdamW(train_only_pe(vit, also=["head"]), lr=1e-4)

The first freeze records every parameter's ``requires_grad``; :func:`restore_requires_grad` puts the flags back,
and so do the integrations' undo functions (``mmpos.integrations.diffusers.restore``,
``mmpos.integrations.timm.restore``), which also remove the encodings and their parameters.
"""

from __future__ import annotations

from typing import Iterable

from torch import nn

from ..encodings.per_block import is_encoding

_SAVED_FLAGS = "_mmpos_requires_grad"  # model attribute: {parameter name: requires_grad before the first freeze}


def named_pe_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of every encoding parameter in ``model``, in ``model.named_parameters()`` order."""
    prefixes = tuple(f"{name}." for name, module in model.named_modules() if is_encoding(module) and name)
    return [(name, param) for name, param in model.named_parameters() if name.startswith(prefixes)]


def pe_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The encodings' parameters of ``model`` (see :func:`named_pe_parameters`)."""
    return [param for _, param in named_pe_parameters(model)]


def train_only_pe(model: nn.Module, also: Iterable[str] = ()) -> list[nn.Parameter]:
    """Freeze every parameter of ``model`` except the encodings' and those named in ``also``; returns the
    trainable ones (for the optimiser), in ``model.named_parameters()`` order.

    Args:
        model: a model holding mmpos encodings.
        also: more parameters to keep trainable, by full name or module prefix as ``named_parameters`` spells
            them (e.g. ``["head"]`` for a classifier).

    Raises:
        ValueError: the encodings have no parameters, or an entry of ``also`` names no parameter.
    """
    names = [name for name, _ in named_pe_parameters(model)]
    if not names:
        raise ValueError(
            f"{type(model).__name__}: its encodings have no parameters to train (a learned encoding "
            "such as rope_mixed, comrope_ld, harope or ape_learned has)"
        )
    names += _named_by(model, also)
    return [model.get_parameter(name) for name in freeze_all_but(model, set(names))]


def freeze_all_but_pe(model: nn.Module) -> list[str]:
    """Make only the encodings' parameters trainable; returns their names, sorted (nothing to train is no error)."""
    return sorted(freeze_all_but(model, {name for name, _ in named_pe_parameters(model)}))


def _named_by(model: nn.Module, patterns: Iterable[str]) -> list[str]:
    if isinstance(patterns, str):
        raise TypeError(f"also must be a list of names, got the string {patterns!r}")
    names = []
    for pattern in patterns:
        found = [n for n, _ in model.named_parameters() if n == pattern or n.startswith(f"{pattern}.")]
        if not found:
            raise ValueError(f"also: {pattern!r} names no parameter of {type(model).__name__}")
        names += found
    return names


def freeze_all_but(model: nn.Module, trainable: set[str]) -> list[str]:
    """Set ``requires_grad`` to ``name in trainable`` for every parameter; returns the trainable names in order.
    The flags as they were before the first such call are kept for :func:`restore_requires_grad`."""
    if _SAVED_FLAGS not in model.__dict__:
        model.__dict__[_SAVED_FLAGS] = {name: param.requires_grad for name, param in model.named_parameters()}
    kept = []
    for name, param in model.named_parameters():
        param.requires_grad_(name in trainable)
        if name in trainable:
            kept.append(name)
    return kept


def restore_requires_grad(model: nn.Module) -> None:
    """Give every parameter the ``requires_grad`` it had before the first :func:`train_only_pe` /
    :func:`freeze_all_but_pe` on ``model`` (parameters added since keep theirs); nothing to do if none ran."""
    saved = model.__dict__.pop(_SAVED_FLAGS, None)
    if saved is None:
        return
    for name, param in model.named_parameters():
        if name in saved:
            param.requires_grad_(saved[name])
