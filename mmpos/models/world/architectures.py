"""The world transformers' architectures, by the config key ``architecture``: ``flux`` (FLUX.1,
``FluxTransformer2DModel``, every task) and ``flux2`` (FLUX.2, ``Flux2Transformer2DModel``, t2i)."""

from __future__ import annotations

from ..._validation import check_choice
from .flux2 import build_flux2_transformer
from .image import build_transformer

ARCHITECTURES = {"flux": build_transformer, "flux2": build_flux2_transformer}


def build_world_transformer(architecture: str, task: str, latent_channels: int = 4, scale_factor: int = 2, **overrides):
    """A fresh world transformer of ``architecture`` for ``task``; ``overrides`` replace config entries."""
    check_choice("architecture", architecture, tuple(ARCHITECTURES))
    return ARCHITECTURES[architecture](task, latent_channels, scale_factor, **overrides)
