"""Tiny random pipelines of the LTX lineage (LTX-Video, LTX-2), registered by
:mod:`mmpos.integrations.diffusers.tiny_pipelines`: the conformance suite's transformer
(:mod:`~mmpos.integrations.diffusers.families.tiny`) on a tiny LTX video VAE (LTX-2: and a tiny audio VAE, vocoder
and text connectors), no T5 / Gemma text encoder (the pipeline takes prompt embeddings)."""

from __future__ import annotations

import torch

from .families import tiny as tiny_models
from .tiny_parts import (
    TinyPipeline,
    family_recipes,
    flow_scheduler,
    image_input,
    ltx2_video_vae,
    masked_prompt_embeds,
    required_none,
    seeded,
)


# ---- LTX-Video --------------------------------------------------------------------------------------------------
def ltx_components() -> dict:
    """Parts of a tiny LTX-Video pipeline: the conformance transformer (4 latent channels, captions of width 16), a
    4-level ``AutoencoderKLLTXVideo`` scaling twice in space and time (diffusers' pipeline-test VAE on 4 channels),
    no text encoder (prompt embeddings and their mask)."""
    from diffusers import AutoencoderKLLTXVideo

    levels = dict(
        block_out_channels=(8,) * 4, layers_per_block=(1,) * 5, spatio_temporal_scaling=(True, True, False, False)
    )
    decoder = {f"decoder_{key}": value for key, value in levels.items()}
    vae = AutoencoderKLLTXVideo(latent_channels=4, patch_size=1, **levels, **decoder).eval()
    vae.use_framewise_encoding = vae.use_framewise_decoding = False
    return dict(
        transformer=tiny_models.tiny_ltx().eval(),
        vae=vae,
        scheduler=flow_scheduler(),
        text_encoder=None,
        tokenizer=None,
    )


# ---- LTX-2 ------------------------------------------------------------------------------------------------------
LTX2_TEXT_LAYERS = 2  # text-encoder layers the connectors take, stacked on channels: prompt_embeds [B, L, 16 * 2]


def ltx2_components(pipeline: str = "LTX2Pipeline") -> dict:
    """Parts of a tiny ``LTX2Pipeline`` (or ``pipeline``): the conformance transformer (video and audio), a 2-level
    video VAE (2 pixels per latent, one frame per latent frame), an audio VAE of 2 latent channels x 2 mel bins (the
    audio transformer's 4 inputs), a small vocoder, one-layer text connectors; no Gemma text encoder (prompt
    embeddings)."""
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    vae = ltx2_video_vae()
    mel_bins = 8  # 4 mel bins per latent one
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, ch_mult=(1, 2), num_res_blocks=1, latent_channels=2, mel_bins=mel_bins, resolution=16
    ).eval()
    vocoder = LTX2Vocoder(
        in_channels=2 * mel_bins,
        hidden_channels=8,
        upsample_kernel_sizes=[4, 4],
        upsample_factors=[2, 2],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1]],
    ).eval()
    connector = dict(num_attention_heads=2, attention_head_dim=8, num_layers=1, num_learnable_registers=None)
    connectors = LTX2TextConnectors(
        caption_channels=tiny_models.LTX2_CONFIG["caption_channels"],
        text_proj_in_factor=LTX2_TEXT_LAYERS,
        **{f"{stream}_connector_{key}": value for stream in ("video", "audio") for key, value in connector.items()},
    ).eval()
    return {
        **required_none(pipeline),
        "transformer": tiny_models.tiny_ltx2().eval(),
        "vae": vae,
        "audio_vae": audio_vae,
        "vocoder": vocoder,
        "connectors": connectors,
        "scheduler": flow_scheduler(),
    }


def ltx2_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """``prompt_embeds [B, L, 16 * 2]`` (two text-encoder layers) and ``prompt_attention_mask [B, L]`` (the last
    token padded)."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, -1] = 0
    width = tiny_models.LTX2_CONFIG["caption_channels"] * LTX2_TEXT_LAYERS
    return dict(prompt_embeds=torch.randn(batch, length, width, generator=generator), prompt_attention_mask=mask)


LTX2_NO_GUIDANCE = dict(  # no classifier-free, spatio-temporal or modality guidance: one transformer pass per step
    guidance_scale=1.0,
    audio_guidance_scale=1.0,
    stg_scale=0.0,
    audio_stg_scale=0.0,
    modality_scale=1.0,
    audio_modality_scale=1.0,
)


def recipes() -> list[TinyPipeline]:
    ltx = family_recipes("ltx", ltx_components, masked_prompt_embeds, 32, frames=9, call=dict(guidance_scale=1.0))
    return [
        ltx("LTXPipeline"),
        ltx("LTXImageToVideoPipeline", inputs=image_input),
        ltx("LTXConditionPipeline", inputs=image_input),
        TinyPipeline(
            "ltx2",
            "LTX2Pipeline",
            seeded(ltx2_components),
            ltx2_prompt_embeds,
            32,  # the pipeline asks for multiples of 32 pixels
            frames=5,
            call=LTX2_NO_GUIDANCE,
        ),
        TinyPipeline(
            "ltx2",
            "LTX2ImageToVideoPipeline",
            seeded(lambda: ltx2_components("LTX2ImageToVideoPipeline")),
            ltx2_prompt_embeds,
            32,  # the pipeline asks for multiples of 32 pixels
            frames=5,
            inputs=image_input,
            call=dict(LTX2_NO_GUIDANCE, image_crf=0),  # no H.264 re-compression of the image (it needs PyAV)
        ),
    ]
