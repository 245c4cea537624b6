"""Tiny random pipelines of the later video families (Kandinsky 6), registered by
:mod:`mmpos.integrations.diffusers.tiny_pipelines` beside its own and built the same way: the conformance suite's
transformer (:mod:`~mmpos.integrations.diffusers.families.tiny`), a tiny video VAE, no text encoder (the pipeline
takes prompt embeddings)."""

from __future__ import annotations

import torch

from .families import tiny as tiny_models
from .tiny_pipelines import TinyPipeline, _flow_scheduler, _required_none, hunyuan_video_components, seeded


# ---- Kandinsky 6 ------------------------------------------------------------------------------------------------
def kandinsky6_components() -> dict:
    """Parts of a tiny ``Kandinsky6TI2VAPipeline`` without sound: the conformance transformer (patch (1, 2, 2)) on
    HunyuanVideo's tiny VAE (2 pixels and 4 frames per latent), no audio VAE and vocoder (the call sets
    ``sample_audio=False``), no Qwen2.5-VL / CLIP text encoders (prompt embeddings)."""
    return {
        **_required_none("Kandinsky6TI2VAPipeline"),
        "transformer": tiny_models.tiny_kandinsky6().eval(),
        "vae": hunyuan_video_components()["vae"],
        "scheduler": _flow_scheduler(),
    }


def kandinsky6_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """Qwen ``prompt_embeds [B, L, 16]`` and CLIP's ``pooled_prompt_embeds [B, 8]``."""
    generator = torch.Generator().manual_seed(seed)
    config = tiny_models.KANDINSKY6_CONFIG
    return dict(
        prompt_embeds=torch.randn(batch, length, config["in_text_dim"], generator=generator),
        pooled_prompt_embeds=torch.randn(batch, config["in_text_dim2"], generator=generator),
    )


def recipes() -> list[TinyPipeline]:
    return [
        TinyPipeline(
            "kandinsky6",
            "Kandinsky6TI2VAPipeline",
            seeded(kandinsky6_components),
            kandinsky6_prompt_embeds,
            16,
            frames=5,
            call=dict(guidance_scale=1.0, sample_audio=False),
        ),
    ]
