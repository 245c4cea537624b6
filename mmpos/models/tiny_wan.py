"""Tiny random Wan components built in code (diffusers' test-style configs, no downloads): transformer, VAE
(8x spatial, 4x temporal compression as Wan's), a one-layer UMT5 encoder with a word-level tokenizer built
offline, and for image-to-video a tiny CLIP vision encoder. For tests and for ``mmpos generate video`` on a
machine without weights: the videos are noise-like, the plumbing is the real one.
"""

from __future__ import annotations

import torch

from .tiny_tokenizers import word_t5_tokenizer

LATENT_CHANNELS = 4
TEXT_DIM = 32
IMAGE_DIM = 8
WORDS = (
    "a",
    "the",
    "on",
    "at",
    "of",
    "and",
    "camera",
    "orbit",
    "room",
    "house",
    "street",
    "video",
    "slow",
    "moving",
    "around",
    "into",
    "view",
    "scene",
)


def tiny_wan_transformer(image_to_video: bool = False, seed: int = 0, num_layers: int = 2):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    extra = dict(image_dim=IMAGE_DIM, added_kv_proj_dim=24) if image_to_video else {}
    in_channels = 2 * LATENT_CHANNELS + 4 if image_to_video else LATENT_CHANNELS  # + mask (temporal factor 4)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=in_channels,
        out_channels=LATENT_CHANNELS,
        text_dim=TEXT_DIM,
        freq_dim=256,
        ffn_dim=32,
        num_layers=num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
        **extra,
    ).eval()


def tiny_wan_vae(seed: int = 0):
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    return AutoencoderKLWan(
        base_dim=3,
        z_dim=LATENT_CHANNELS,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * LATENT_CHANNELS,
        latents_std=[1.0] * LATENT_CHANNELS,
    ).eval()


def tiny_umt5(seed: int = 0):
    """``(text_encoder, tokenizer)``: a one-layer UMT5 and a word-level tokenizer (unknown words map to ``<unk>``)."""
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = word_t5_tokenizer(WORDS, model_max_length=512)
    config = UMT5Config(
        vocab_size=tokenizer.vocab_size,
        d_model=TEXT_DIM,
        d_kv=8,
        d_ff=37,
        num_layers=1,
        num_heads=2,
        relative_attention_num_buckets=8,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        encoder = UMT5EncoderModel(config)
    return encoder.eval(), tokenizer


def tiny_clip_vision(seed: int = 0, width: int = IMAGE_DIM):
    """``(image_encoder, image_processor)`` for image-to-video (32x32 crops, hidden width ``width``)."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(seed)
    config = CLIPVisionConfig(
        hidden_size=width,
        projection_dim=width,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=16,
        intermediate_size=16,
    )
    return CLIPVisionModel(config).eval(), CLIPImageProcessor(crop_size=32, size=32)


def tiny_wan_components(image_to_video: bool = False, seed: int = 0, num_layers: int = 2) -> dict:
    """Keyword arguments of ``WanPipeline`` (or ``WanImageToVideoPipeline``), every module in eval mode."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    text_encoder, tokenizer = tiny_umt5(seed)
    parts = dict(
        transformer=tiny_wan_transformer(image_to_video, seed, num_layers),
        vae=tiny_wan_vae(seed),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
    if image_to_video:
        parts["image_encoder"], parts["image_processor"] = tiny_clip_vision(seed)
    return parts
