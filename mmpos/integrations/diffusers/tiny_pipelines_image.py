"""Tiny random pipelines of the later image families (Krea 2, ...): the recipes
:mod:`mmpos.integrations.diffusers.tiny_pipelines` registers beside its own, built the same way (the conformance
suite's transformer of :mod:`~mmpos.integrations.diffusers.families.tiny`, a tiny VAE, no text encoder: the
pipeline takes prompt embeddings)."""

from __future__ import annotations

import torch

from .families import tiny as tiny_models
from .tiny_pipelines import TinyPipeline, _flow_scheduler, _required_none, seeded

NO_CFG = dict(guidance_scale=1.0)  # classifier-free guidance would encode an empty negative prompt


def _padded_mask(batch: int, length: int, dtype=torch.long) -> torch.Tensor:
    """``[B, L]`` ones with the last token padded (0)."""
    mask = torch.ones(batch, length, dtype=dtype)
    mask[:, -1] = 0
    return mask


def _qwen_vae(z_dim: int = 4):
    """``AutoencoderKLQwenImage`` of ``z_dim`` latent channels, 8 pixels per latent (3 downsamplings)."""
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage(
        base_dim=4,
        z_dim=z_dim,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    ).eval()


# ---- Krea 2 -----------------------------------------------------------------------------------------------------
def krea2_components() -> dict:
    """Parts of a tiny ``Krea2Pipeline``: the conformance transformer (4 inputs: one latent channel packed 2 x 2) on a
    one-channel Qwen-Image VAE (8 pixels per latent: one token is 16 x 16 pixels), no Qwen3-VL text encoder."""
    return {
        **_required_none("Krea2Pipeline"),
        "transformer": tiny_models.tiny_krea2().eval(),
        "vae": _qwen_vae(z_dim=1),
        "scheduler": _flow_scheduler(),
    }


def krea2_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """``prompt_embeds [B, L, 2, 16]`` (two text-encoder layers per token) and ``prompt_embeds_mask [B, L]`` (bool,
    as the attention takes it)."""
    config = tiny_models.KREA2_CONFIG
    shape = (batch, length, config["num_text_layers"], config["text_hidden_dim"])
    embeds = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return dict(prompt_embeds=embeds, prompt_embeds_mask=_padded_mask(batch, length, torch.bool))


def recipes() -> list[TinyPipeline]:
    return [
        # guidance_scale 0: no classifier-free guidance (1 would still encode an empty negative prompt)
        TinyPipeline(
            "krea2", "Krea2Pipeline", seeded(krea2_components), krea2_prompt_embeds, 32, call=dict(guidance_scale=0.0)
        ),
    ]
