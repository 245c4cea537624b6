"""The parts the tiny pipeline recipes share (:mod:`mmpos.integrations.diffusers.tiny_pipelines`, which registers
them, and its companions ``tiny_pipelines_image``, ``tiny_pipelines_video`` and the lineage modules
``tiny_pipelines_wan``, ``tiny_pipelines_hunyuan``, ``tiny_pipelines_ltx``): the recipe type and its call, a seeded
build, tiny VAEs, a tiny SigLIP image encoder, a scheduler, prompt embeddings and condition images and videos."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass(frozen=True)
class TinyPipeline:
    """How to build one family's pipeline tiny: its diffusers class, its parts and a call that runs it."""

    family: str
    pipeline: str  # the diffusers pipeline class name
    components: Callable[[], dict]  # seeded, every module in eval mode
    prompt_embeds: Callable[[int], dict]  # batch -> the prompt-embedding tensors its __call__ takes
    side: int  # a small output height and width in pixels (one or a few tokens per side)
    frames: int | None = None  # video pipelines: num_frames
    inputs: Callable[[int], dict] = field(default=lambda side: {})  # side -> image / mask / video inputs
    call: dict = field(default_factory=dict)  # fixed call arguments (guidance without negative embeddings)
    sized: bool = True  # False: the call takes no height / width / num_frames (the output size follows the inputs)

    def build(self):
        """The pipeline, from :attr:`components`."""
        import diffusers

        return getattr(diffusers, self.pipeline)(**self.components())


def family_recipes(family: str, components, prompt_embeds, side: int, **shared) -> Callable[..., TinyPipeline]:
    """``make(pipeline, parts=None, **more)``: the recipe of ``family``'s ``pipeline`` (``parts`` and ``more``
    override the family's ``components`` and ``shared`` fields)."""

    def make(pipeline: str, parts: Callable[[], dict] | None = None, **more) -> TinyPipeline:
        return TinyPipeline(family, pipeline, seeded(parts or components), prompt_embeds, side, **{**shared, **more})

    return make


def tiny_call(recipe: TinyPipeline, steps: int = 1, batch: int = 1) -> dict:
    """Keyword arguments of one tiny run of ``recipe``'s pipeline: its prompt embeddings, size, inputs, ``steps``."""
    size = dict(height=recipe.side, width=recipe.side) if recipe.sized else {}
    if recipe.frames is not None and recipe.sized:
        size["num_frames"] = recipe.frames
    size["num_inference_steps"] = steps
    return {**recipe.prompt_embeds(batch), **size, **recipe.inputs(recipe.side), **recipe.call}


def kl_vae(levels: int, latent_channels: int, **config):
    """``AutoencoderKL`` of ``levels`` one-block levels: ``2 ** (levels - 1)`` pixels per latent."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=(4,) * levels,
        down_block_types=("DownEncoderBlock2D",) * levels,
        up_block_types=("UpDecoderBlock2D",) * levels,
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=1,
        **config,
    ).eval()


def flux2_vae():
    from diffusers import AutoencoderKLFlux2

    return AutoencoderKLFlux2(
        block_out_channels=(8, 8),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
    ).eval()


def seeded(build: Callable[[], dict], seed: int = 0) -> Callable[[], dict]:
    """``build`` run under ``torch.manual_seed(seed)``, the caller's RNG state restored."""

    def built() -> dict:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return build()

    return built


def flow_scheduler(**config):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**config)


def width16_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """``prompt_embeds [B, L, 16]``, no mask (Z-Image, Qwen-Image 2.1)."""
    return dict(prompt_embeds=torch.randn(batch, length, 16, generator=torch.Generator().manual_seed(seed)))


def masked_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """``prompt_embeds [B, L, 16]`` and ``prompt_attention_mask [B, L]`` (the last token padded)."""
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, -1] = 0
    return dict(width16_prompt_embeds(batch, length, seed), prompt_attention_mask=mask)


def t5_length_prompt_embeds(config: dict, batch: int = 1, seed: int = 3) -> dict:
    """``prompt_embeds [B, L, D]`` for a CogVideoX-style transformer ``config``: its ``max_text_seq_length`` (L)
    tokens of its ``text_embed_dim`` (D, the T5 width)."""
    length, width = (config[key] for key in ("max_text_seq_length", "text_embed_dim"))
    return dict(prompt_embeds=torch.randn(batch, length, width, generator=torch.Generator().manual_seed(seed)))


def required_none(pipeline: str) -> dict:
    """``{name: None}`` for every component ``pipeline``'s ``__init__`` requires."""
    import inspect

    import diffusers

    init = inspect.signature(getattr(diffusers, pipeline).__init__).parameters
    return {name: None for name, p in init.items() if name != "self" and p.default is inspect.Parameter.empty}


def pil_image(height: int, width: int, seed: int = 2):
    """A smooth random RGB PIL image (the edit pipelines read ``image.size``)."""
    import numpy as np
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(1, 3, max(1, height // 8), max(1, width // 8), generator=generator)
    fine = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    return Image.fromarray((fine[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))


def image_input(side: int) -> dict:
    return dict(image=pil_image(side, side))


def pil_video(side: int, frames: int = 5, seed: int = 2) -> list:
    """``frames`` smooth random ``side x side`` PIL frames (seeds ``seed``, ``seed + 1``, ...)."""
    return [pil_image(side, side, seed=seed + i) for i in range(frames)]


def video_input(side: int) -> dict:
    return dict(video=pil_video(side))


def siglip_vision(width: int, image_size: int = 16):
    """``(image_encoder, feature_extractor)``: a one-layer SigLIP vision tower of width ``width`` on ``image_size``
    pixels (patches of ``image_size / 2``: 4 image tokens) and its processor resizing to that size."""
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    config = SiglipVisionConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=image_size,
        patch_size=image_size // 2,
    )
    return SiglipVisionModel(config).eval(), SiglipImageProcessor(size={"height": image_size, "width": image_size})


def hunyuan_video_vae():
    """A 3-level ``AutoencoderKLHunyuanVideo`` of 4 latent channels: 2 pixels and 4 frames per latent (the smallest
    temporal ratio it has)."""
    from diffusers import AutoencoderKLHunyuanVideo

    return AutoencoderKLHunyuanVideo(
        latent_channels=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 3,
        up_block_types=("HunyuanVideoUpBlock3D",) * 3,
        block_out_channels=(8,) * 3,
        layers_per_block=1,
        norm_num_groups=4,
        spatial_compression_ratio=2,
        temporal_compression_ratio=4,
    ).eval()


def cogvideox_vae():
    """A 4-level ``AutoencoderKLCogVideoX`` of 4 latent channels: 8 pixels and 4 frames per latent."""
    from diffusers import AutoencoderKLCogVideoX

    return AutoencoderKLCogVideoX(
        block_out_channels=(8,) * 4, latent_channels=4, layers_per_block=1, norm_num_groups=2
    ).eval()


def ltx2_video_vae():
    """A 2-level ``AutoencoderKLLTX2Video`` of 4 latent channels: 2 pixels per latent, one frame per latent frame."""
    from diffusers import AutoencoderKLLTX2Video

    levels = dict(block_out_channels=(8, 8), layers_per_block=(1, 1, 1), spatio_temporal_scaling=(True, False))
    vae = AutoencoderKLLTX2Video(
        latent_channels=4,
        patch_size=1,
        down_block_types=("LTX2VideoDownBlock3D",) * 2,
        downsample_type=("spatial", "spatial"),
        upsample_type=("spatial", "spatial"),
        upsample_residual=(False, False),
        upsample_factor=(1, 1),
        decoder_inject_noise=(False,) * 3,
        spatial_compression_ratio=2,
        temporal_compression_ratio=1,
        **levels,
        **{f"decoder_{key}": value for key, value in levels.items()},
    )
    return vae.eval()
