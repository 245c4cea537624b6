"""Exponential moving average of a model's weights, shared by the DiT and the mini-world trainers."""

from __future__ import annotations

import copy

import torch
from torch import nn


class EMA(nn.Module):
    """``ema = d * ema + (1 - d) * p`` over a model's parameters; buffers are copied.

    ``ema.model`` is a full copy (for a diffusers model, ``ema.model.save_pretrained`` works). With ``warmup``
    the decay of update ``n`` (1-based) is ``min(decay, (1 + n) / (10 + n))``, so early averages do not keep the
    random initialisation. ``state_dict()`` holds ``model.*`` and the update count ``num_updates``.

    Args:
        model: the trained module (its current weights start the average).
        decay: in ``[0, 1)``.
        warmup: ramp the decay up over the first updates (see above).
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, *, warmup: bool = False):
        super().__init__()
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay, self.warmup = decay, warmup
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))

    def current_decay(self) -> float:
        """The decay the next :meth:`update` uses."""
        n = int(self.num_updates) + 1
        return min(self.decay, (1 + n) / (10 + n)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average towards ``model``'s parameters; copy its buffers."""
        weight = 1.0 - self.current_decay()
        self.num_updates += 1
        ema_params = dict(self.model.named_parameters())
        pairs = [(ema_params[name], param.detach()) for name, param in model.named_parameters()]
        torch._foreach_lerp_([ema for ema, _ in pairs], [p.to(ema.dtype) for ema, p in pairs], weight)
        ema_buffers = dict(self.model.named_buffers())
        for name, buffer in model.named_buffers():
            ema_buffers[name].copy_(buffer)

    def copy_to(self, model: nn.Module) -> nn.Module:
        """Load the averaged weights into ``model`` (cast to its dtypes); returns ``model``."""
        model.load_state_dict(self.model.state_dict())
        return model

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        state_dict = dict(state_dict)
        state_dict.setdefault("num_updates", torch.zeros((), dtype=torch.long))  # states saved before the count
        return super().load_state_dict(state_dict, strict, assign)
