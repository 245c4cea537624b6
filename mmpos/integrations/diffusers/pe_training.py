"""PE parameters of an installed encoding: list them, train only them, keep them fp32 under a cast."""
from __future__ import annotations

import torch
from torch import nn

from .api import position_module


def pe_parameters(transformer: nn.Module) -> list[nn.Parameter]:
    """The parameters of the installed encodings (e.g. RoPE-Mixed frequencies, HARoPE's skew parameters)."""
    return list(position_module(transformer).encodings.parameters())


def train_only_pe(transformer: nn.Module) -> list[nn.Parameter]:
    """Freeze every parameter except the encodings'; returns those (for the optimiser)."""
    trainable = pe_parameters(transformer)
    if not trainable:
        raise ValueError(f"the installed encoding {transformer._mmpos_installed.pe!r} has no parameters to train")
    transformer.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)
    return trainable


def cast_keeping_pe_fp32(transformer: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``transformer.to(dtype)`` except the installed encodings' parameters, which keep their fp32 values
    (learned frequencies rounded to bf16 would move every position's phase)."""
    encodings = position_module(transformer).encodings
    saved = {k: v.detach().clone() for k, v in encodings.state_dict().items()}
    transformer.to(dtype)
    encodings.float()
    encodings.load_state_dict(saved)
    return transformer
