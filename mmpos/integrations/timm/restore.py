"""``restore(model)``: undo :func:`~.convert.convert`; the timm model computes what it computed before, bit for bit.

``convert`` records an :class:`OriginalState` before it changes anything and keeps the record on the model
(``model.mmpos_original``); :func:`restore` puts back what it recorded: the attention classes, timm's rope and
learned ``pos_embed`` (with the cls / register tokens an ``ape_learned`` take-over changed), the patch-embedding
and dropout settings, and the ``requires_grad`` flags ``train_only_pe`` / ``freeze_all_but_pe`` changed; it removes
the encodings, their hooks and the attributes ``convert`` added.
"""

from __future__ import annotations

import torch
from timm.models._features import FeatureGetterNet
from timm.models.naflexvit import NaFlexVit
from torch import nn

from ..pe_parameters import restore_requires_grad
from .positions import ForwardStep

_ADDED = ("mmpos_positions", "mmpos_pe", "mmpos_ape", "no_weight_decay", "__prepare_scriptable__")


class OriginalState:
    """The values ``convert`` may change, as they were (plain object: not in ``state_dict``, copied by deepcopy)."""

    def __init__(self, model: nn.Module):
        embeds = model.embeds if isinstance(model, NaFlexVit) else model.patch_embed
        self.attributes = [
            (owner, name, getattr(owner, name))
            for owner, names in (
                (model, ("rope", "rope_mixed", "rope_is_mixed", "pos_embed", "dynamic_img_size", "patch_drop")),
                (
                    embeds,
                    (
                        "pos_embed",
                        "pos_embed_y",
                        "pos_embed_x",
                        "pos_embed_type",
                        "strict_img_size",
                        "flatten",
                        "output_fmt",
                    ),
                ),
            )
            for name in names
            if hasattr(owner, name)
        ]
        self.attention_classes = [(block.attn, type(block.attn)) for block in model.blocks]
        self.tokens = {
            name: getattr(model, name).detach().clone()
            for name in ("cls_token", "reg_token")
            if isinstance(getattr(model, name, None), torch.Tensor)
        }

    def put_back(self, model: nn.Module) -> None:
        for attn, original_class in self.attention_classes:
            for name in ("pe", "positions"):
                if name in attn.__dict__ or name in attn._modules:
                    delattr(attn, name)
            attn.__class__ = original_class
        device, dtype = _place(model)
        for owner, name, value in self.attributes:
            if isinstance(value, nn.Parameter) and (value.device, value.dtype) != (device, dtype):
                value = nn.Parameter(value.detach().to(device, dtype), requires_grad=value.requires_grad)
            elif isinstance(value, nn.Module):
                value = value.to(device)
            setattr(owner, name, value)
        with torch.no_grad():
            for name, saved in self.tokens.items():
                getattr(model, name).copy_(saved)


def _place(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of the model's weights now (``model.to(...)`` after convert moved all but the record)."""
    weight = next(p for p in model.parameters() if p.is_floating_point())
    return weight.device, weight.dtype


def restore(model: nn.Module) -> nn.Module:
    """Undo :func:`~.convert.convert` on ``model`` in place and return it: the timm model as it was (same class
    per attention, same parameters and buffers, same outputs bit for bit, same ``requires_grad`` flags).

    Raises:
        ValueError: ``model`` was not converted by mmpos.
    """
    if isinstance(model, FeatureGetterNet):  # timm's features_only wrapper: restore the model inside
        restore(model.model)
        return model
    original = model.__dict__.get("mmpos_original")
    if original is None:
        raise ValueError(
            f"{type(model).__name__} was not converted by mmpos.integrations.timm.convert; nothing to restore"
        )
    restore_requires_grad(model)
    original.put_back(model)
    _remove_hooks(model)
    for name in (*_ADDED, "mmpos_original"):
        if name in model.__dict__ or name in model._modules:
            delattr(model, name)
    return model


def _remove_hooks(model: nn.Module) -> None:
    for module in model.modules():
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for handle_id in [i for i, hook in hooks.items() if isinstance(hook, ForwardStep)]:
                del hooks[handle_id]
                module._forward_hooks_with_kwargs.pop(handle_id, None)
                module._forward_pre_hooks_with_kwargs.pop(handle_id, None)
                module._forward_hooks_always_called.pop(handle_id, None)
