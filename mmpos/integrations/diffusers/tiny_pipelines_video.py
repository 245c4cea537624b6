"""Tiny random pipelines of the later video families (Kandinsky 6, ConsisID, EasyAnimate, Motif-Video, Mochi), registered by
:mod:`mmpos.integrations.diffusers.tiny_pipelines` beside its own and built the same way: the conformance suite's
transformer (:mod:`~mmpos.integrations.diffusers.families.tiny`), a tiny video VAE, no text encoder (the pipeline
takes prompt embeddings)."""

from __future__ import annotations

import torch

from .families import tiny as tiny_models
from .tiny_parts import (
    TinyPipeline,
    cogvideox_vae,
    flow_scheduler,
    hunyuan_video_vae,
    image_input,
    required_none,
    seeded,
)


# ---- Kandinsky 6 ------------------------------------------------------------------------------------------------
def kandinsky6_components() -> dict:
    """Parts of a tiny ``Kandinsky6TI2VAPipeline`` without sound: the conformance transformer (patch (1, 2, 2)) on
    HunyuanVideo's tiny VAE (2 pixels and 4 frames per latent), no audio VAE and vocoder (the call sets
    ``sample_audio=False``), no Qwen2.5-VL / CLIP text encoders (prompt embeddings)."""
    return {
        **required_none("Kandinsky6TI2VAPipeline"),
        "transformer": tiny_models.tiny_kandinsky6().eval(),
        "vae": hunyuan_video_vae(),
        "scheduler": flow_scheduler(),
    }


def kandinsky6_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """Qwen ``prompt_embeds [B, L, 16]`` and CLIP's ``pooled_prompt_embeds [B, 8]``."""
    generator = torch.Generator().manual_seed(seed)
    config = tiny_models.KANDINSKY6_CONFIG
    return dict(
        prompt_embeds=torch.randn(batch, length, config["in_text_dim"], generator=generator),
        pooled_prompt_embeds=torch.randn(batch, config["in_text_dim2"], generator=generator),
    )


# ---- ConsisID ---------------------------------------------------------------------------------------------------
def consisid_components() -> dict:
    """Parts of a tiny ``ConsisIDPipeline``: the conformance transformer (no face branch: the call's face features
    unused) taking the image latents concatenated on channels (8 in), CogVideoX's tiny VAE and DDIM scheduler, no T5
    text encoder (prompt embeddings)."""
    from diffusers import CogVideoXDDIMScheduler, ConsisIDTransformer3DModel

    transformer = ConsisIDTransformer3DModel(**{**tiny_models.CONSISID_CONFIG, "in_channels": 8}).eval()
    return dict(
        tokenizer=None,
        text_encoder=None,
        vae=cogvideox_vae(),
        transformer=transformer,
        scheduler=CogVideoXDDIMScheduler(),
    )


def consisid_prompt_embeds(batch: int = 1, seed: int = 3) -> dict:
    """``prompt_embeds [B, 8, 8]``: the transformer's ``max_text_seq_length`` tokens of T5 width 8."""
    length, width = (tiny_models.CONSISID_CONFIG[key] for key in ("max_text_seq_length", "text_embed_dim"))
    return dict(prompt_embeds=torch.randn(batch, length, width, generator=torch.Generator().manual_seed(seed)))


# ---- EasyAnimate ------------------------------------------------------------------------------------------------
def easyanimate_components() -> dict:
    """Parts of a tiny ``EasyAnimatePipeline``: the conformance transformer (patch 15) on a 4-level
    ``AutoencoderKLMagvit`` of 8 channels (8 pixels and 4 frames per latent), no Qwen2-VL text encoder (prompt
    embeddings)."""
    from diffusers import AutoencoderKLMagvit

    vae = AutoencoderKLMagvit(
        latent_channels=4,
        block_out_channels=(8,) * 4,
        down_block_types=("SpatialDownBlock3D",) + ("SpatialTemporalDownBlock3D",) * 3,
        up_block_types=("SpatialUpBlock3D",) + ("SpatialTemporalUpBlock3D",) * 3,
        layers_per_block=1,
        norm_num_groups=4,
    ).eval()
    return {
        **required_none("EasyAnimatePipeline"),
        "transformer": tiny_models.tiny_easyanimate().eval(),
        "vae": vae,
        "scheduler": flow_scheduler(),
    }


def masked_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """``prompt_embeds [B, L, 16]`` and ``prompt_attention_mask [B, L]`` (the last token padded)."""
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, -1] = 0
    embeds = torch.randn(batch, length, 16, generator=torch.Generator().manual_seed(seed))
    return dict(prompt_embeds=embeds, prompt_attention_mask=mask)


# ---- Motif-Video ------------------------------------------------------------------------------------------------
def motif_video_components(pipeline: str = "MotifVideoPipeline") -> dict:
    """Parts of a tiny ``MotifVideoPipeline`` (or ``pipeline``): the conformance transformer taking noisy latents | condition latents |
    mask (2 x 4 + 1 channels, zero conditions in text-to-video) on Wan's tiny VAE, a guider without classifier-free
    guidance, no T5Gemma text encoder (prompt embeddings; image-to-video: no SigLIP image embedding either, as the
    pipeline does without its text encoder's vision tower)."""
    from diffusers.guiders import ClassifierFreeGuidance
    from diffusers.models.transformers.transformer_motif_video import MotifVideoTransformer3DModel

    from mmpos.models.tiny_wan import tiny_wan_vae

    return {
        **required_none(pipeline),
        "transformer": MotifVideoTransformer3DModel(**{**tiny_models.MOTIF_VIDEO_CONFIG, "in_channels": 9}).eval(),
        "vae": tiny_wan_vae(),
        "scheduler": flow_scheduler(),
        "guider": ClassifierFreeGuidance(guidance_scale=1.0),
    }


# ---- Mochi ------------------------------------------------------------------------------------------------------
def mochi_components() -> dict:
    """Parts of a tiny ``MochiPipeline``: the conformance transformer (learned ``pos_frequencies`` set, 4 latent
    channels) on an ``AutoencoderKLMochi`` of 32 channels (its group norms take 32 groups) with the pipeline's fixed
    8 pixels and 6 frames per latent, no latent mean and std (the pipeline's de-normalisation reads 12 channels
    there, so it falls back to ``scaling_factor``), the scheduler with ``invert_sigmas`` as Mochi's is; no T5 text
    encoder (prompt embeddings with their mask)."""
    from diffusers import AutoencoderKLMochi

    vae = AutoencoderKLMochi(
        latent_channels=tiny_models.MOCHI_CONFIG["in_channels"],
        encoder_block_out_channels=(32,) * 4,
        decoder_block_out_channels=(32,) * 4,
        layers_per_block=(1,) * 5,
        add_attention_block=(False,) * 5,
        latents_mean=None,
        latents_std=None,
    ).eval()
    return {
        **required_none("MochiPipeline"),
        "transformer": tiny_models.tiny_mochi().eval(),
        "vae": vae,
        "scheduler": flow_scheduler(invert_sigmas=True),
    }


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
        TinyPipeline(
            "consisid",
            "ConsisIDPipeline",
            seeded(consisid_components),
            consisid_prompt_embeds,
            64,
            frames=5,
            inputs=image_input,
            call=dict(guidance_scale=1.0),
        ),
        # the pipeline asks for multiples of 16 pixels, the transformer for latents in patches of 15: 240 pixels are
        # 30 x 30 latents, 2 x 2 tokens
        TinyPipeline(
            "easyanimate",
            "EasyAnimatePipeline",
            seeded(easyanimate_components),
            masked_prompt_embeds,
            240,
            frames=5,
            call=dict(guidance_scale=1.0),
        ),
        TinyPipeline(
            "motif_video",
            "MotifVideoPipeline",
            seeded(motif_video_components),
            masked_prompt_embeds,
            32,
            frames=5,
        ),
        TinyPipeline(
            "motif_video",
            "MotifVideoImage2VideoPipeline",
            seeded(lambda: motif_video_components("MotifVideoImage2VideoPipeline")),
            masked_prompt_embeds,
            32,
            frames=5,
            inputs=image_input,
            call=dict(prompt=None),  # a required argument, even with prompt embeddings
        ),
        # 7 frames: 2 latent frames; the pipeline's linear-quadratic sigma schedule needs 2 steps or more
        TinyPipeline(
            "mochi",
            "MochiPipeline",
            seeded(mochi_components),
            masked_prompt_embeds,
            32,
            frames=7,
            call=dict(guidance_scale=1.0, num_inference_steps=2),
        ),
    ]
