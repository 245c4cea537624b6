"""Tiny random pipelines of the later image families (Krea 2, GLM-Image, HunyuanImage 2.1, NucleusMoE-Image, PRX,
Lumina-Next, BRIA FIBO 2, ERNIE-Image), registered by :mod:`mmpos.integrations.diffusers.tiny_pipelines` beside its
own and built the same way: the conformance suite's transformer (:mod:`~mmpos.integrations.diffusers.families.tiny`),
a tiny VAE, no text encoder (the pipeline takes prompt embeddings)."""

from __future__ import annotations

import torch

from .families import tiny as tiny_models
from .tiny_parts import (
    TinyPipeline,
    flow_scheduler,
    flux2_vae,
    kl_vae,
    required_none,
    seeded,
    width16_prompt_embeds,
)

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
        **required_none("Krea2Pipeline"),
        "transformer": tiny_models.tiny_krea2().eval(),
        "vae": _qwen_vae(z_dim=1),
        "scheduler": flow_scheduler(),
    }


def krea2_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """``prompt_embeds [B, L, 2, 16]`` (two text-encoder layers per token) and ``prompt_embeds_mask [B, L]`` (bool,
    as the attention takes it)."""
    config = tiny_models.KREA2_CONFIG
    shape = (batch, length, config["num_text_layers"], config["text_hidden_dim"])
    embeds = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return dict(prompt_embeds=embeds, prompt_embeds_mask=_padded_mask(batch, length, torch.bool))


# ---- GLM-Image --------------------------------------------------------------------------------------------------
GLM_IMAGE_SIDE = 32  # the pipeline asks for multiples of 8 (VAE) x 2 (patch) x 2 pixels: 2 x 2 tokens


def glm_image_components() -> dict:
    """Parts of a tiny ``GlmImagePipeline``: the conformance transformer (patch 2) on a 4-level VAE (8 pixels per
    latent, latent mean 0 and std 1), no GLM vision-language prior model nor ByT5 glyph encoder (the call takes the
    prior tokens and the glyph embeddings)."""
    return {
        **required_none("GlmImagePipeline"),
        "transformer": tiny_models.tiny_glm_image().eval(),
        "vae": kl_vae(4, 4, latents_mean=[0.0] * 4, latents_std=[1.0] * 4),
        "scheduler": flow_scheduler(),
    }


def glm_image_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """ByT5 glyph ``prompt_embeds [B, L, 16]`` and ``prior_token_ids [B, 4]`` (one codebook id per image token of a
    32 x 32 image, what the vision-language prior would generate)."""
    generator = torch.Generator().manual_seed(seed)
    config = tiny_models.GLM_IMAGE_CONFIG
    tokens = (GLM_IMAGE_SIDE // (8 * config["patch_size"])) ** 2
    return dict(
        prompt_embeds=torch.randn(batch, length, config["text_embed_dim"], generator=generator),
        prior_token_ids=torch.randint(config["prior_vq_quantizer_codebook_size"], (batch, tokens), generator=generator),
    )


# ---- HunyuanImage 2.1 -------------------------------------------------------------------------------------------
HUNYUAN_IMAGE_BYT5_DIM = 8  # width of the tiny ByT5 glyph embeddings


def hunyuan_image_components() -> dict:
    """Parts of a tiny ``HunyuanImagePipeline``: the conformance transformer (patch 1) with a ByT5 glyph projection,
    a 2-level ``AutoencoderKLHunyuanImage`` (2 pixels per latent; 32 channels, its group norms' count), no guider
    (no classifier-free guidance), no Qwen2.5-VL / ByT5 text encoders (prompt embeddings)."""
    from diffusers import AutoencoderKLHunyuanImage, HunyuanImageTransformer2DModel

    config = {**tiny_models.HUNYUAN_IMAGE_CONFIG, "text_embed_2_dim": HUNYUAN_IMAGE_BYT5_DIM}
    vae = AutoencoderKLHunyuanImage(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(32, 32),
        layers_per_block=1,
        spatial_compression_ratio=2,
        sample_size=32,
        scaling_factor=1.0,
    ).eval()
    return {
        **required_none("HunyuanImagePipeline"),
        "transformer": HunyuanImageTransformer2DModel(**config).eval(),
        "vae": vae,
        "scheduler": flow_scheduler(),
    }


def hunyuan_image_prompt_embeds(batch: int = 1, length: int = 5, glyphs: int = 3, seed: int = 3) -> dict:
    """Qwen ``prompt_embeds [B, L, 16]`` with ``prompt_embeds_mask [B, L]`` (the last token padded) and ByT5
    ``prompt_embeds_2 [B, glyphs, 8]`` with its all-ones mask."""
    generator = torch.Generator().manual_seed(seed)
    width = tiny_models.HUNYUAN_IMAGE_CONFIG["text_embed_dim"]
    return dict(
        prompt_embeds=torch.randn(batch, length, width, generator=generator),
        prompt_embeds_mask=_padded_mask(batch, length),
        prompt_embeds_2=torch.randn(batch, glyphs, HUNYUAN_IMAGE_BYT5_DIM, generator=generator),
        prompt_embeds_mask_2=torch.ones(batch, glyphs, dtype=torch.long),
    )


# ---- NucleusMoE-Image --------------------------------------------------------------------------------------------
def nucleusmoe_components() -> dict:
    """Parts of a tiny ``NucleusMoEImagePipeline``: the conformance transformer (4 latent channels packed 2 x 2) on
    a 4-channel Qwen-Image VAE (8 pixels per latent: one token is 16 x 16 pixels), no Qwen3-VL text encoder."""
    return {
        **required_none("NucleusMoEImagePipeline"),
        "transformer": tiny_models.tiny_nucleusmoe().eval(),
        "vae": _qwen_vae(),
        "scheduler": flow_scheduler(),
    }


def width16_masked_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """``prompt_embeds [B, L, 16]`` and ``prompt_embeds_mask [B, L]`` (the last token padded)."""
    embeds = torch.randn(batch, length, 16, generator=torch.Generator().manual_seed(seed))
    return dict(prompt_embeds=embeds, prompt_embeds_mask=_padded_mask(batch, length))


# ---- PRX --------------------------------------------------------------------------------------------------------
def prx_components() -> dict:
    """Parts of a tiny ``PRXPipeline``: the conformance transformer (patch 2) on a 2-level VAE (2 pixels per latent),
    no T5Gemma text encoder (prompt embeddings)."""
    return {
        **required_none("PRXPipeline"),
        "transformer": tiny_models.tiny_prx().eval(),
        "vae": kl_vae(2, 4, shift_factor=0.0, scaling_factor=1.0),
        "scheduler": flow_scheduler(),
    }


def prx_pixel_components() -> dict:
    """Parts of a tiny ``PRXPixelPipeline``: the conformance transformer on RGB pixels (3 channels, patch 2, a
    bottleneck patch projection and resolution embeddings, as PRXPixel's), no VAE, no Qwen3-VL text encoder."""
    transformer = tiny_models.tiny_prx(in_channels=3, bottleneck_size=8, resolution_embeds=True)
    return {**required_none("PRXPixelPipeline"), "transformer": transformer.eval(), "scheduler": flow_scheduler()}


def bool_masked_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """``prompt_embeds [B, L, 16]`` and a bool ``prompt_attention_mask [B, L]`` (the last token padded)."""
    embeds = torch.randn(batch, length, 16, generator=torch.Generator().manual_seed(seed))
    return dict(prompt_embeds=embeds, prompt_attention_mask=_padded_mask(batch, length, torch.bool))


# ---- Lumina-Next ------------------------------------------------------------------------------------------------
def lumina_next_components() -> dict:
    """Parts of a tiny ``LuminaPipeline``: the conformance transformer (patch 2, captions of width 32) predicting
    the variance too (the pipeline keeps the first half of its channels) on a 4-level VAE (the pipeline assumes 8
    pixels per latent), no Gemma text encoder (prompt embeddings)."""
    from diffusers import LuminaNextDiT2DModel

    return {
        **required_none("LuminaPipeline"),
        "transformer": LuminaNextDiT2DModel(**{**tiny_models.LUMINA_NEXT_CONFIG, "learn_sigma": True}).eval(),
        "vae": kl_vae(4, 4, shift_factor=0.0, scaling_factor=1.0),
        "scheduler": flow_scheduler(),
    }


def lumina_next_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """Gemma ``prompt_embeds [B, L, 32]`` and ``prompt_attention_mask [B, L]`` (the last token padded)."""
    width = tiny_models.LUMINA_NEXT_CONFIG["cross_attention_dim"]
    embeds = torch.randn(batch, length, width, generator=torch.Generator().manual_seed(seed))
    return dict(prompt_embeds=embeds, prompt_attention_mask=_padded_mask(batch, length))


# ---- BRIA FIBO 2 ------------------------------------------------------------------------------------------------
def bria_fibo2_components() -> dict:
    """Parts of a tiny ``BriaFibo2Pipeline``: the conformance transformer (patch 2) on FLUX.2's tiny VAE (2 pixels per
    latent), no Qwen3-VL text encoder (prompt embeddings)."""
    return {
        **required_none("BriaFibo2Pipeline"),
        "transformer": tiny_models.tiny_bria_fibo2().eval(),
        "vae": flux2_vae(),
        "scheduler": flow_scheduler(),
    }


def bria_fibo2_prompt_embeds(batch: int = 1, length: int = 6, seed: int = 3) -> dict:
    """``prompt_embeds [B, 2, L, 16]`` (the Perceiver's and the injection layer's text-layer bundles) and a bool
    ``prompt_embeds_mask [B, L]`` (the last token padded)."""
    embeds = torch.randn(batch, 2, length, 16, generator=torch.Generator().manual_seed(seed))
    return dict(prompt_embeds=embeds, prompt_embeds_mask=_padded_mask(batch, length, torch.bool))


# ---- ERNIE-Image ------------------------------------------------------------------------------------------------
def ernie_image_components() -> dict:
    """Parts of a tiny ``ErnieImagePipeline``: the conformance transformer (its zero-initialised modulation and
    output given weights, else it predicts zero) on FLUX.2's tiny VAE, whose 4 latent channels the pipeline takes
    2 x 2-packed (16 in and out; 4 pixels per token), no Ministral text encoder nor prompt enhancer."""
    return {
        **required_none("ErnieImagePipeline"),
        "transformer": tiny_models.tiny_ernie_image(in_channels=16, out_channels=16).eval(),
        "vae": flux2_vae(),
        "scheduler": flow_scheduler(),
    }


def recipes() -> list[TinyPipeline]:
    prx_call = dict(NO_CFG, use_resolution_binning=False)  # not resized to its trained sizes
    return [
        # guidance_scale 0: no classifier-free guidance (1 would still encode an empty negative prompt)
        TinyPipeline(
            "krea2", "Krea2Pipeline", seeded(krea2_components), krea2_prompt_embeds, 32, call=dict(guidance_scale=0.0)
        ),
        TinyPipeline(
            "glm_image",
            "GlmImagePipeline",
            seeded(glm_image_components),
            glm_image_prompt_embeds,
            GLM_IMAGE_SIDE,
            call=NO_CFG,
        ),
        TinyPipeline(
            "hunyuan_image",
            "HunyuanImagePipeline",
            seeded(hunyuan_image_components),
            hunyuan_image_prompt_embeds,
            16,
            call=dict(distilled_guidance_scale=None),
        ),
        TinyPipeline(
            "nucleusmoe_image",
            "NucleusMoEImagePipeline",
            seeded(nucleusmoe_components),
            width16_masked_embeds,
            32,
            call=NO_CFG,
        ),
        TinyPipeline("prx", "PRXPipeline", seeded(prx_components), bool_masked_embeds, 16, call=prx_call),
        TinyPipeline("prx", "PRXPixelPipeline", seeded(prx_pixel_components), bool_masked_embeds, 8, call=prx_call),
        TinyPipeline(
            "lumina_next",
            "LuminaPipeline",
            seeded(lumina_next_components),
            lumina_next_prompt_embeds,
            32,
            call=dict(NO_CFG, clean_caption=False),  # clean_caption needs bs4 and ftfy
        ),
        TinyPipeline(
            "bria_fibo2", "BriaFibo2Pipeline", seeded(bria_fibo2_components), bria_fibo2_prompt_embeds, 16, call=NO_CFG
        ),
        # use_pe=False: no prompt enhancer rewriting the prompt
        TinyPipeline(
            "ernie_image",
            "ErnieImagePipeline",
            seeded(ernie_image_components),
            width16_prompt_embeds,
            32,
            call=dict(NO_CFG, use_pe=False),
        ),
    ]
