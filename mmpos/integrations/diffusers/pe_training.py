"""PE parameters of an installed encoding: list them, train only them, keep them fp32 under a cast."""

from __future__ import annotations

import torch
from torch import nn

from ..pe_parameters import pe_parameters as shared_pe_parameters
from ..pe_parameters import train_only_pe as shared_train_only_pe
from .api import position_module


def pe_parameters(transformer: nn.Module) -> list[nn.Parameter]:
    """The parameters of the installed encodings (e.g. RoPE-Mixed frequencies, HARoPE's skew parameters);
    :func:`mmpos.integrations.pe_parameters.pe_parameters` after checking that ``set_pe`` was called."""
    position_module(transformer)  # raises when no encoding is installed
    return shared_pe_parameters(transformer)


def train_only_pe(transformer: nn.Module, also=()) -> list[nn.Parameter]:
    """Freeze every parameter except the encodings' (and ``also``); returns those (for the optimiser). See
    :func:`mmpos.integrations.pe_parameters.train_only_pe`."""
    position_module(transformer)  # raises when no encoding is installed
    return shared_train_only_pe(transformer, also)


def cast_keeping_pe_fp32(transformer: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``transformer.to(dtype)`` except the installed encodings' parameters, which keep their fp32 values
    (learned frequencies rounded to bf16 would move every position's phase)."""
    encodings = position_module(transformer).encodings
    saved = {k: v.detach().clone() for k, v in encodings.state_dict().items()}
    transformer.to(dtype)
    encodings.float()
    encodings.load_state_dict(saved)
    return transformer
