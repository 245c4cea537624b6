"""The trained unit (transformer + text encoder) and loading trained world models to continue training."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ...models.world.image import load_pretrained, transformer_channels


class DenoiserWithText(nn.Module):
    """The trained unit: a Flux transformer and its text encoder (optimised jointly)."""

    def __init__(self, transformer, text_encoder):
        super().__init__()
        self.transformer, self.text_encoder = transformer, text_encoder


def load_trained_vae(path, device):
    from diffusers import AutoencoderKL

    if path is None:
        raise ValueError("vae_path is required for transformer tasks; train the VAE first (task: vae)")
    folder = Path(path)
    folder = folder / "world-vae" if (folder / "world-vae").is_dir() else folder
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"no VAE checkpoint at {folder} (expected config.json); train one with scripts/train_world.py --task vae"
        )
    vae = load_pretrained(AutoencoderKL, folder, torch_dtype=torch.float32).to(device)
    return vae.eval().requires_grad_(False)


def _task_folder(path, task: str) -> Path:
    """``path/world-<task>`` when it exists, else ``path`` itself."""
    folder = Path(path)
    return folder / f"world-{task}" if (folder / f"world-{task}").is_dir() else folder


def load_trained_denoiser(
    path, task: str, device, vae_latent_channels: int = 4, vae_factor: int = 2
) -> DenoiserWithText:
    """A trained world model (``path`` holds ``world-<task>/`` or is it), in fp32, to continue training; its
    input channels must be those of ``task`` on the VAE (``vae_latent_channels``, ``vae_factor``)."""
    from diffusers import FluxTransformer2DModel

    from ...models.world.text import WorldTextEncoder

    folder = _task_folder(path, task)
    if not (folder / "transformer" / "config.json").is_file():
        raise FileNotFoundError(f"init_from: no {task} checkpoint at {folder} (expected transformer/config.json)")
    transformer = load_pretrained(FluxTransformer2DModel, folder / "transformer", torch_dtype=torch.float32)
    expected = transformer_channels(task, vae_latent_channels, vae_factor)[0]
    if transformer.config.in_channels != expected:
        raise ValueError(
            f"init_from: {folder} holds a transformer with in_channels={transformer.config.in_channels}; "
            f"a {task} model on this VAE has {expected} (is it another task's checkpoint?)"
        )
    text_encoder = load_pretrained(WorldTextEncoder, folder / "text_encoder", torch_dtype=torch.float32)
    return DenoiserWithText(transformer, text_encoder).to(device).train()


def check_same_config(what: str, wanted: dict, loaded) -> None:
    """Raise when an ``init_from`` option differs from the loaded checkpoint's config."""
    for key, value in wanted.items():
        have = loaded.get(key)
        if (list(have) if isinstance(have, (tuple, list)) else have) != (
            list(value) if isinstance(value, (tuple, list)) else value
        ):
            raise ValueError(f"init_from: {what} {key}={value!r} differs from the checkpoint's {have!r}")


def previous_training(path, task: str) -> dict:
    """What the ``init_from`` checkpoint's own model card says of its training (steps, minutes, val loss)."""
    card_path = _task_folder(path, task) / "model_card.json"
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    return {
        "path": str(path),
        "val_loss": card.get("val_loss"),
        "total_steps": card.get("total_steps", card.get("steps", 0)),
        "total_train_minutes": card.get("total_train_minutes", card.get("train_minutes", 0.0)),
    }
