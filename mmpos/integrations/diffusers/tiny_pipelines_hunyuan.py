"""Tiny random pipelines of the HunyuanVideo lineage (HunyuanVideo and SkyReels' image-to-video on it, HunyuanVideo
1.5, FramePack), registered by :mod:`mmpos.integrations.diffusers.tiny_pipelines`: the conformance suite's transformer
(:mod:`~mmpos.integrations.diffusers.families.tiny`) on a tiny HunyuanVideo VAE, no Llama / CLIP / Qwen2.5-VL / ByT5
text encoders (the pipeline takes prompt embeddings)."""

from __future__ import annotations

import torch

from .families import tiny as tiny_models
from .tiny_parts import (
    TinyPipeline,
    family_recipes,
    flow_scheduler,
    hunyuan_video_vae,
    image_input,
    required_none,
    seeded,
    siglip_vision,
)


# ---- HunyuanVideo 1.5 ---------------------------------------------------------------------------------------------
def hunyuan_video15_components() -> dict:
    """Parts of a tiny ``HunyuanVideo15Pipeline``: the conformance transformer taking noisy latents | condition
    latents | mask (2 x 4 + 1 channels), a 2-level ``AutoencoderKLHunyuanVideo15`` (2 pixels and 2 frames per latent),
    a guider without classifier-free guidance, no Qwen2.5-VL / ByT5 text encoders (prompt embeddings)."""
    from diffusers import AutoencoderKLHunyuanVideo15, HunyuanVideo15Transformer3DModel
    from diffusers.guiders import ClassifierFreeGuidance

    vae = AutoencoderKLHunyuanVideo15(
        latent_channels=4,
        block_out_channels=(8, 8),
        layers_per_block=1,
        spatial_compression_ratio=2,
        temporal_compression_ratio=2,
    ).eval()
    transformer = HunyuanVideo15Transformer3DModel(**{**tiny_models.HUNYUAN_VIDEO15_CONFIG, "in_channels": 9}).eval()
    return dict(
        transformer=transformer,
        vae=vae,
        scheduler=flow_scheduler(),
        guider=ClassifierFreeGuidance(guidance_scale=1.0),
        **dict.fromkeys(("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")),
    )


def hunyuan_video15_prompt_embeds(batch: int = 1, length: int = 5, byt5: int = 3, seed: int = 3) -> dict:
    """Qwen ``prompt_embeds [B, L, 16]`` with ``prompt_embeds_mask [B, L]`` (the last token padded) and ByT5
    ``prompt_embeds_2 [B, byt5, 16]`` with its all-ones mask."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, -1] = 0
    return dict(
        prompt_embeds=torch.randn(batch, length, 16, generator=generator),
        prompt_embeds_mask=mask,
        prompt_embeds_2=torch.randn(batch, byt5, 16, generator=generator),
        prompt_embeds_mask_2=torch.ones(batch, byt5, dtype=torch.long),
    )


# ---- HunyuanVideo -----------------------------------------------------------------------------------------------
def hunyuan_video_components(image_latents: bool = False) -> dict:
    """Parts of a tiny ``HunyuanVideoPipeline``: the conformance transformer, a 3-level ``AutoencoderKLHunyuanVideo``
    (2 pixels and 4 frames per latent: the smallest temporal ratio it has), no Llama / CLIP text encoders (prompt
    embeddings); ``image_latents``: SkyReels' image-to-video transformer, taking the image latents concatenated on
    channels (8 in)."""
    from diffusers import HunyuanVideoTransformer3DModel

    config = {**tiny_models.HUNYUAN_VIDEO_CONFIG, "in_channels": 8 if image_latents else 4}
    pipeline = "HunyuanSkyreelsImageToVideoPipeline" if image_latents else "HunyuanVideoPipeline"
    return {
        **required_none(pipeline),
        "transformer": HunyuanVideoTransformer3DModel(**config).eval(),
        "vae": hunyuan_video_vae(),
        "scheduler": flow_scheduler(),
    }


def hunyuan_video_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """Llama ``prompt_embeds [B, L, 16]`` with ``prompt_attention_mask [B, L]`` (the last token padded) and CLIP's
    ``pooled_prompt_embeds [B, 8]``."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, -1] = 0
    return dict(
        prompt_embeds=torch.randn(batch, length, 16, generator=generator),
        prompt_attention_mask=mask,
        pooled_prompt_embeds=torch.randn(batch, 8, generator=generator),
    )


# ---- FramePack ----------------------------------------------------------------------------------------------------
def framepack_components() -> dict:
    """Parts of a tiny ``HunyuanVideoFramepackPipeline``: the conformance transformer (guidance-distilled, with the
    image projection and the clean-latent embedders) on HunyuanVideo's tiny VAE, a one-layer SigLIP image encoder at
    the transformer's ``image_proj_dim`` (8; 16 x 16 pixels in 4 patches), no Llama / CLIP text encoders (prompt
    embeddings)."""
    image_encoder, feature_extractor = siglip_vision(tiny_models.FRAMEPACK_CONFIG["image_proj_dim"])
    return {
        **required_none("HunyuanVideoFramepackPipeline"),
        "transformer": tiny_models.tiny_framepack().eval(),
        "vae": hunyuan_video_vae(),
        "scheduler": flow_scheduler(),
        "image_encoder": image_encoder,
        "feature_extractor": feature_extractor,
    }


def recipes() -> list[TinyPipeline]:
    hunyuan_video = family_recipes("hunyuan_video", hunyuan_video_components, hunyuan_video_prompt_embeds, 16, frames=5)
    return [
        TinyPipeline(
            "hunyuan_video15",
            "HunyuanVideo15Pipeline",
            seeded(hunyuan_video15_components),
            hunyuan_video15_prompt_embeds,
            16,
            frames=5,
        ),
        hunyuan_video("HunyuanVideoPipeline"),
        hunyuan_video(
            "HunyuanSkyreelsImageToVideoPipeline",
            lambda: hunyuan_video_components(image_latents=True),
            inputs=image_input,
        ),
        # a latent window of 2 frames: 5 frames are one section (the first image's latent and 2 new ones: 9 frames)
        TinyPipeline(
            "hunyuan_video_framepack",
            "HunyuanVideoFramepackPipeline",
            seeded(framepack_components),
            hunyuan_video_prompt_embeds,
            16,
            frames=5,
            inputs=image_input,
            call=dict(latent_window_size=2),
        ),
    ]
