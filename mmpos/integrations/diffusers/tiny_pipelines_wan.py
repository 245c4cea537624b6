"""Tiny random pipelines of the Wan lineage (Wan, SkyReels-V2, Wan VACE, ChronoEdit, Wan Animate, AnyFlow), registered
by :mod:`mmpos.integrations.diffusers.tiny_pipelines`: each family's transformer on Wan's tiny VAE
(:mod:`mmpos.models.tiny_wan`: 8 pixels and 4 frames per latent), Wan's one-layer UMT5 and word-level tokenizer for Wan
itself, prompt embeddings for the others."""

from __future__ import annotations

import torch

from .families import tiny as tiny_models
from .tiny_parts import (
    TinyPipeline,
    family_recipes,
    flow_scheduler,
    image_input,
    pil_image,
    pil_video,
    required_none,
    seeded,
    video_input,
    width16_prompt_embeds,
)

NO_CFG = dict(guidance_scale=1.0)  # classifier-free guidance would encode an empty negative prompt


def wan_components(image_to_video: bool = False) -> dict:
    from mmpos.models.tiny_wan import tiny_wan_components

    return tiny_wan_components(image_to_video=image_to_video)


def wan_like_components(pipeline: str, transformer) -> dict:
    """``pipeline``'s parts for a Wan-lineage ``transformer`` (4 latent channels, text width 16): Wan's tiny VAE, a
    flow-matching scheduler (shift 3) and ``None`` for its text encoder and tokenizer (prompt embeddings)."""
    from mmpos.models.tiny_wan import tiny_wan_vae

    others = required_none(pipeline)
    return {**others, "transformer": transformer.eval(), "vae": tiny_wan_vae(), "scheduler": flow_scheduler(shift=3.0)}


def wan_prompt_embeds(batch: int = 1, length: int = 6, seed: int = 1) -> dict:
    from mmpos.models.tiny_wan import TEXT_DIM

    return dict(prompt_embeds=torch.randn(batch, length, TEXT_DIM, generator=torch.Generator().manual_seed(seed)))


# ---- ChronoEdit, Wan VACE -----------------------------------------------------------------------------------------
def chronoedit_components() -> dict:
    """Parts of a tiny ``ChronoEditPipeline``: its transformer taking the noisy latents, the image latents and the
    4-channel frame mask (12 channels) and the image embedding of Wan's tiny CLIP vision encoder, Wan's tiny VAE;
    no text encoder."""
    from mmpos.models.tiny_wan import IMAGE_DIM, tiny_clip_vision

    encoder, processor = tiny_clip_vision()
    transformer = tiny_models.tiny_chronoedit(in_channels=12, image_dim=IMAGE_DIM)
    return {
        **wan_like_components("ChronoEditPipeline", transformer),
        "image_encoder": encoder,
        "image_processor": processor,
    }


def _wan_vace_transformer():
    """The conformance suite's tiny Wan VACE transformer taking the pipeline's control input: 2 x 4 latent channels
    and the 8 x 8 mask folded to 64 channels."""
    from diffusers import WanVACETransformer3DModel

    return WanVACETransformer3DModel(**tiny_models.WAN_CLONE_CONFIG, vace_layers=[0, 1], vace_in_channels=72)


# ---- Wan Animate --------------------------------------------------------------------------------------------------
FACE_SIDE = 16  # the tiny Wan Animate transformer's motion_encoder_size: its face frames are 16 x 16 pixels


def wan_animate_components() -> dict:
    """Parts of a tiny ``WanAnimatePipeline``: the conformance transformer (noisy latents | reference mask |
    reference latents: 3 x 4 channels; a motion encoder on 16 x 16 face frames) on Wan's tiny VAE, Wan's tiny CLIP
    vision encoder at the transformer's image width (16: the penultimate hidden states are the image tokens), a
    flow-matching scheduler (the pipeline's UniPC steps the same ``step(output, t, sample)`` way), no UMT5 text
    encoder (prompt embeddings)."""
    from mmpos.models.tiny_wan import tiny_clip_vision

    transformer = tiny_models.tiny_wan_animate()
    encoder, processor = tiny_clip_vision(width=transformer.config.image_dim)
    return {
        **wan_like_components("WanAnimatePipeline", transformer),
        "image_encoder": encoder,
        "image_processor": processor,
    }


def wan_animate_inputs(side: int) -> dict:
    """The character image, a 5-frame pose video of the output size and a 5-frame face video of
    :data:`FACE_SIDE` pixels (tiny random videos: the output has the pose video's 5 frames)."""
    return dict(image=pil_image(side, side), pose_video=pil_video(side), face_video=pil_video(FACE_SIDE, seed=9))


# ---- AnyFlow ------------------------------------------------------------------------------------------------------
def anyflow_components() -> dict:
    """Parts of a tiny ``AnyFlowPipeline``: the conformance transformer (per-frame latents, timesteps ``t`` and ``r``)
    on Wan's tiny VAE, the flow-map Euler scheduler the pipeline steps, no UMT5 text encoder (prompt embeddings)."""
    from diffusers import FlowMapEulerDiscreteScheduler

    parts = wan_like_components("AnyFlowPipeline", tiny_models.tiny_anyflow())
    return {**parts, "scheduler": FlowMapEulerDiscreteScheduler()}


def _wan_like(family: str, pipeline: str, transformer) -> TinyPipeline:
    parts = seeded(lambda: wan_like_components(pipeline, transformer()))
    return TinyPipeline(family, pipeline, parts, width16_prompt_embeds, 32, frames=5, call=NO_CFG)


def recipes() -> list[TinyPipeline]:
    wan = family_recipes("wan", wan_components, wan_prompt_embeds, 32, frames=5, call=NO_CFG)
    return [
        wan("WanPipeline"),
        wan("WanImageToVideoPipeline", lambda: wan_components(image_to_video=True), inputs=image_input),
        wan("WanVideoToVideoPipeline", frames=None, inputs=video_input, call=dict(NO_CFG, strength=1.0)),
        _wan_like("skyreels_v2", "SkyReelsV2Pipeline", tiny_models.tiny_skyreels_v2),
        _wan_like("wan_vace", "WanVACEPipeline", _wan_vace_transformer),
        TinyPipeline(
            "chronoedit",
            "ChronoEditPipeline",
            seeded(chronoedit_components),
            width16_prompt_embeds,
            32,
            frames=5,
            inputs=image_input,
            call=NO_CFG,
        ),
        # no num_frames: the video has the pose video's frames, in one segment of 5 (4 new frames after the first)
        TinyPipeline(
            "wan_animate",
            "WanAnimatePipeline",
            seeded(wan_animate_components),
            width16_prompt_embeds,
            32,
            inputs=wan_animate_inputs,
            call=dict(NO_CFG, segment_frame_length=5),
        ),
        TinyPipeline("anyflow", "AnyFlowPipeline", seeded(anyflow_components), width16_prompt_embeds, 32, frames=5),
    ]
