"""What every editing pipeline shares: `EditPipelineMixin` (layer rules, an `EditSession` over the pipeline's
transformer, VAE packing) and `coerce_config` (a config dataclass from an instance, a dict or None)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch

from .attention import attention_layer_names, select_layers
from .context import EditContext, EditSession


def coerce_config(cls, value):
    """A config dataclass from an instance, a dict (unknown keys are an error) or None (defaults)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} option(s) {unknown}; expected some of {sorted(known)}")
        return cls(**value)
    raise TypeError(f"expected a {cls.__name__}, a dict or None, got {type(value).__name__}")


class EditPipelineMixin:
    """Gives a diffusers Flux pipeline an :class:`EditSession` over its own transformer and scheduler."""

    def _layer_rules(self, layers, rule) -> dict[int, Any]:
        transformer = self.transformer
        names = attention_layer_names(transformer)
        indices = select_layers(layers, len(names), len(transformer.transformer_blocks))
        return dict.fromkeys(indices, rule)

    def edit_session(self, context: EditContext) -> EditSession:
        return EditSession(self.transformer, context, self.scheduler)

    @property
    def token_pixels(self) -> int:
        """Pixels per side of one transformer token (VAE factor x 2x2 packing; 16 for FLUX.1)."""
        return self.vae_scale_factor * 2

    def encode_packed(self, image: torch.Tensor, generator=None) -> torch.Tensor:
        """VAE-encode ``[B, 3, H, W]`` in [-1, 1] to packed latents ``[B, H*W/256, 4C]`` (scaled and shifted)."""
        if self.vae is None:
            raise ValueError("a VAE is needed to encode images; pass latents instead or load the pipeline with a vae")
        vae = self.vae
        image = image.to(device=self._execution_device, dtype=vae.dtype)
        posterior = vae.encode(image).latent_dist
        latents = posterior.mode() if generator is None else posterior.sample(generator)
        latents = (latents - vae.config.shift_factor) * vae.config.scaling_factor
        b, c, h, w = latents.shape
        return self._pack_latents(latents, b, c, h, w)
