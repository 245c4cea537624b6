"""Tiny random pipelines of the Kandinsky video lineage (Kandinsky 5, 6 and 6 SR), the SANA video lineage (SANA-Video,
SANA-WM) and the later video families (ConsisID, EasyAnimate, Motif-Video, Mochi), registered by
:mod:`mmpos.integrations.diffusers.tiny_pipelines` beside its own and built the same way: the conformance suite's
transformer (:mod:`~mmpos.integrations.diffusers.families.tiny`), a tiny video VAE, no text encoder (the pipeline
takes prompt embeddings)."""

from __future__ import annotations

import torch

from .families import tiny as tiny_models
from .tiny_parts import (
    TinyPipeline,
    cogvideox_vae,
    family_recipes,
    flow_scheduler,
    hunyuan_video_vae,
    image_input,
    ltx2_video_vae,
    masked_prompt_embeds,
    pil_image,
    pil_video,
    required_none,
    seeded,
    t5_length_prompt_embeds,
)


# ---- Kandinsky 5 ------------------------------------------------------------------------------------------------
def kandinsky5_components(image_to_video: bool = False) -> dict:
    """Parts of a tiny ``Kandinsky5T2VPipeline``: the conformance transformer on HunyuanVideo's tiny VAE, no Qwen2.5-VL
    / CLIP text encoders (prompt embeddings); ``image_to_video``: its ``visual_cond`` transformer (noisy latents |
    first-frame latents | mask)."""
    pipeline = "Kandinsky5I2VPipeline" if image_to_video else "Kandinsky5T2VPipeline"
    transformer = tiny_models.tiny_kandinsky5(visual_cond=image_to_video)
    return {
        **required_none(pipeline),
        "transformer": transformer.eval(),
        "vae": hunyuan_video_vae(),
        "scheduler": flow_scheduler(),
    }


def kandinsky5_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """Qwen ``prompt_embeds_qwen [B, L, 16]``, CLIP's ``prompt_embeds_clip [B, 8]`` and ``prompt_cu_seqlens [B + 1]``
    (each prompt ``L`` tokens long, int32)."""
    generator = torch.Generator().manual_seed(seed)
    return dict(
        prompt_embeds_qwen=torch.randn(batch, length, 16, generator=generator),
        prompt_embeds_clip=torch.randn(batch, 8, generator=generator),
        prompt_cu_seqlens=torch.arange(batch + 1, dtype=torch.int32) * length,
    )


# ---- SANA-Video -------------------------------------------------------------------------------------------------
def sana_video_components(pipeline: str = "SanaVideoPipeline") -> dict:
    """Parts of a tiny ``SanaVideoPipeline`` (or ``pipeline``): the conformance transformer on Wan's tiny VAE, a
    flow-matching scheduler, no Gemma text encoder (prompt embeddings)."""
    from mmpos.models.tiny_wan import tiny_wan_vae

    return {
        **required_none(pipeline),
        "transformer": tiny_models.tiny_sana_video().eval(),
        "vae": tiny_wan_vae(),
        "scheduler": flow_scheduler(),
    }


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


# ---- Kandinsky 6 SR ---------------------------------------------------------------------------------------------
K6SR_TILE = (
    16  # the tiny transformer's one trained tile: 16 x 16 output pixels, 8 x 8 latents and tokens (NABLA's block)
)


def kandinsky6_sr_components() -> dict:
    """Parts of a tiny ``Kandinsky6SRPipeline``: the conformance transformer (patch 1, NABLA blocks of 8 x 8 tokens)
    trained on one :data:`K6SR_TILE`-pixel tile size, a 2-level ``Kandinsky6SRVAE`` of 4 latent channels (2 pixels and
    4 frames per latent), a flow-matching scheduler, no latent upscaler (the tiles are upscaled in pixels)."""
    from diffusers import Kandinsky6SRTransformer3DModel, Kandinsky6SRVAE

    tiles = ((K6SR_TILE, K6SR_TILE),)
    transformer = Kandinsky6SRTransformer3DModel(**tiny_models.KANDINSKY6_SR_CONFIG, tile_sizes=tiles)
    vae = Kandinsky6SRVAE(
        latent_channels=4, encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8), layers_per_block=1
    )
    return dict(transformer=transformer.eval(), vae=vae.eval(), scheduler=flow_scheduler(), latent_upscaler=None)


def kandinsky6_sr_inputs(side: int) -> dict:
    """A 5-frame low-resolution video of ``side / 2`` pixels (upscaled twice: ``side``)."""
    return dict(video=pil_video(side // 2))


def no_prompt_embeds(batch: int = 1) -> dict:
    """Nothing: the pipeline takes no prompt."""
    return {}


# ---- SANA-WM ------------------------------------------------------------------------------------------------------
def sana_wm_components() -> dict:
    """Parts of a tiny ``SanaWMPipeline``: the conformance transformer (patch 1; 6 Plücker channels per latent frame:
    one video frame per latent frame) on LTX-2's tiny video VAE (2 pixels and one frame per latent), no Gemma-2
    text encoder (prompt embeddings)."""
    return {
        **required_none("SanaWMPipeline"),
        "transformer": tiny_models.tiny_sana_wm().eval(),
        "vae": ltx2_video_vae(),
        "scheduler": flow_scheduler(),
    }


def sana_wm_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """Gemma ``prompt_embeds [B, 1, L, 16]`` and the negative ones, each with its attention mask ``[B, L]`` (the last
    token padded): the pipeline encodes a negative prompt unless given both."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, -1] = 0
    width = tiny_models.SANA_WM_CONFIG["caption_channels"]
    return dict(
        prompt_embeds=torch.randn(batch, 1, length, width, generator=generator),
        prompt_attention_mask=mask,
        negative_prompt_embeds=torch.randn(batch, 1, length, width, generator=generator),
        negative_prompt_attention_mask=mask.clone(),
    )


def sana_wm_inputs(side: int, frames: int = 5) -> dict:
    """The first frame and a camera moving along x and turning about y (``c2w [frames, 4, 4]``), intrinsics of a
    focal length of ``side`` pixels centred on the image."""
    import numpy as np

    angle = np.arange(frames, dtype=np.float32) * 0.1
    c2w = np.tile(np.eye(4, dtype=np.float32), (frames, 1, 1))
    c2w[:, 0, 0], c2w[:, 0, 2], c2w[:, 2, 0], c2w[:, 2, 2] = np.cos(angle), np.sin(angle), -np.sin(angle), np.cos(angle)
    c2w[:, 0, 3] = 0.2 * np.arange(frames)
    return dict(image=pil_image(side, side), c2w=c2w, intrinsics=[float(side), float(side), side / 2, side / 2])


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
    """``prompt_embeds [B, 8, 8]`` for the tiny ConsisID (:func:`~.tiny_parts.t5_length_prompt_embeds`)."""
    return t5_length_prompt_embeds(tiny_models.CONSISID_CONFIG, batch, seed)


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
    no_cfg = dict(guidance_scale=1.0)  # classifier-free guidance would encode an empty negative prompt
    kandinsky5 = family_recipes(
        "kandinsky5", kandinsky5_components, kandinsky5_prompt_embeds, 16, frames=5, call=no_cfg
    )
    # SANA-Video takes `frames`, not num_frames; no resizing to its trained aspect ratios
    sana_call = dict(no_cfg, frames=5, use_resolution_binning=False)
    sana_video = family_recipes("sana_video", sana_video_components, masked_prompt_embeds, 32, call=sana_call)
    return [
        kandinsky5("Kandinsky5T2VPipeline"),
        # 17 frames: 5 latent frames, the 4 first renormalised against the next (fewer: a std of nothing, NaN)
        kandinsky5(
            "Kandinsky5I2VPipeline", lambda: kandinsky5_components(image_to_video=True), frames=17, inputs=image_input
        ),
        sana_video("SanaVideoPipeline"),
        sana_video(
            "SanaImageToVideoPipeline", lambda: sana_video_components("SanaImageToVideoPipeline"), inputs=image_input
        ),
        TinyPipeline(
            "kandinsky6",
            "Kandinsky6TI2VAPipeline",
            seeded(kandinsky6_components),
            kandinsky6_prompt_embeds,
            16,
            frames=5,
            call=dict(guidance_scale=1.0, sample_audio=False),
        ),
        # no height / width / num_frames: the output is the input video's 5 frames at twice its size
        TinyPipeline(
            "kandinsky6_sr",
            "Kandinsky6SRPipeline",
            seeded(kandinsky6_sr_components),
            no_prompt_embeds,
            K6SR_TILE,
            inputs=kandinsky6_sr_inputs,
            call=dict(resolution_scale=2),
            sized=False,
        ),
        # prompt: a required argument, even with prompt embeddings
        TinyPipeline(
            "sana_wm",
            "SanaWMPipeline",
            seeded(sana_wm_components),
            sana_wm_prompt_embeds,
            16,
            frames=5,
            inputs=sana_wm_inputs,
            call=dict(guidance_scale=1.0, prompt=None),
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
