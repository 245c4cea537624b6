"""The parts the tiny pipeline recipes share (:mod:`mmpos.integrations.diffusers.tiny_pipelines`, which registers
them, and its companions ``tiny_pipelines_image`` and ``tiny_pipelines_video``): the recipe type and its call, a
seeded build, tiny VAEs, a scheduler, prompt embeddings and a condition image."""

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

    def build(self):
        """The pipeline, from :attr:`components`."""
        import diffusers

        return getattr(diffusers, self.pipeline)(**self.components())


def tiny_call(recipe: TinyPipeline, steps: int = 1, batch: int = 1) -> dict:
    """Keyword arguments of one tiny run of ``recipe``'s pipeline: its prompt embeddings, size, inputs, ``steps``."""
    size = dict(height=recipe.side, width=recipe.side, num_inference_steps=steps)
    if recipe.frames is not None:
        size["num_frames"] = recipe.frames
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
