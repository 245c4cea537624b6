"""The world's text-to-image model in FLUX.2 architecture: ``Flux2Transformer2DModel`` in ``Flux2Pipeline``'s layout.

- Transformer: the width / depth of the FLUX.1 world t2i model (4 heads x 32, 2 double + 2 single blocks, text
  width 64), FLUX.2's blocks (shared modulation, SwiGLU, no biases), 4-axis RoPE over ``(t, h, w, l)`` ids
  (8 channels per axis, theta 2000), no guidance embedding (true CFG, as FLUX.2 Klein's base models).
- Latents: the world VAE's 4-channel latents ``[B, 4, h, w]`` patchified 2x2 as FLUX.2 does
  (``Flux2Pipeline._patchify_latents``: ``[B, 16, h/2, w/2]``), normalised, then one token per position
  (``_pack_latents``: ``[B, h/2 * w/2, 16]``); image ids ``(0, row, col, 0)``, text ids ``(0, 0, 0, token)``.
- VAE: the world's ``AutoencoderKL`` weights in an ``AutoencoderKLFlux2`` whose batch-norm statistics hold the
  world VAE's latent shift and scale, so FLUX.2's normalisation ``(z - mean) / std`` of the patchified latents
  equals the world's ``(z - shift) * scale``: the training latents are the FLUX.1 world model's, rearranged.
- Text: the world text encoder's sequence embeddings as ``encoder_hidden_states`` (its pooled output is unused).

A folder written by :func:`save_flux2_pipeline_folder` loads with ``Flux2Pipeline.from_pretrained`` (and
``Flux2KleinPipeline.from_pretrained``: same components); prompts go in as ``prompt_embeds``
(:func:`flux2_prompt_kwargs`).
"""

from __future__ import annotations

import inspect

import torch
from diffusers import AutoencoderKL, AutoencoderKLFlux2, Flux2KleinPipeline, Flux2Pipeline, Flux2Transformer2DModel

FLUX2_PIPELINE = Flux2KleinPipeline  # the folder's class: FLUX.2 with true CFG, as the world's FLUX.1 t2i model
FLUX2_TRANSFORMER_CONFIG = dict(
    patch_size=1,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=32,
    num_attention_heads=4,
    joint_attention_dim=64,
    timestep_guidance_channels=256,
    mlp_ratio=3.0,
    axes_dims_rope=(8, 8, 8, 8),
    rope_theta=2000,
    guidance_embeds=False,
)
BATCH_NORM_EPS = 1e-4  # AutoencoderKLFlux2's default


def is_flux2(transformer) -> bool:
    return isinstance(transformer, Flux2Transformer2DModel)


def build_flux2_transformer(
    task: str = "t2i", latent_channels: int = 4, scale_factor: int = 2, **overrides
) -> Flux2Transformer2DModel:
    """The FLUX.2-architecture world transformer (text-to-image only); ``overrides`` replace config entries."""
    if task != "t2i":
        raise ValueError(f"architecture='flux2' trains the t2i task only, got task={task!r}")
    channels = 4 * latent_channels
    return Flux2Transformer2DModel(
        **{**FLUX2_TRANSFORMER_CONFIG, "in_channels": channels, "out_channels": channels, **overrides}
    )


def flux2_tokens(latents: torch.Tensor) -> torch.Tensor:
    """Normalised latents ``[B, C, h, w]`` -> tokens ``[B, h/2 * w/2, 4C]`` (FLUX.2's patchify, then pack)."""
    return Flux2Pipeline._pack_latents(Flux2Pipeline._patchify_latents(latents))


def flux2_image_ids(latents: torch.Tensor) -> torch.Tensor:
    """``[h/2 * w/2, 4]`` ids ``(t=0, row, col, l=0)`` of the tokens of latents ``[B, C, h, w]``."""
    b, c, h, w = latents.shape
    return Flux2Pipeline._prepare_latent_ids(latents.new_empty(1, 4 * c, h // 2, w // 2))[0].to(latents.device)


def flux2_text_ids(embeds: torch.Tensor) -> torch.Tensor:
    """``[L, 4]`` ids ``(0, 0, 0, token index)`` of text embeddings ``[B, L, D]``."""
    return Flux2Pipeline._prepare_text_ids(embeds[:1])[0].to(embeds.device)


def flux2_vae(vae: AutoencoderKL) -> AutoencoderKLFlux2:
    """The world VAE's weights in an ``AutoencoderKLFlux2`` whose ``bn`` (the patchified latents' normalisation)
    holds the world VAE's ``shift_factor`` (mean) and ``1 / scaling_factor`` (std) on every channel."""
    c = vae.config
    out = AutoencoderKLFlux2(
        in_channels=c.in_channels,
        out_channels=c.out_channels,
        down_block_types=tuple(c.down_block_types),
        up_block_types=tuple(c.up_block_types),
        block_out_channels=tuple(c.block_out_channels),
        layers_per_block=c.layers_per_block,
        act_fn=c.act_fn,
        latent_channels=c.latent_channels,
        norm_num_groups=c.norm_num_groups,
        sample_size=c.sample_size,
        use_quant_conv=c.use_quant_conv,
        use_post_quant_conv=c.use_post_quant_conv,
        mid_block_add_attention=c.mid_block_add_attention,
        batch_norm_eps=BATCH_NORM_EPS,
    )
    missing, unexpected = out.load_state_dict(vae.state_dict(), strict=False)
    if unexpected or any(not key.startswith("bn.") for key in missing):
        raise ValueError(f"the world VAE does not fit AutoencoderKLFlux2: missing {missing}, unexpected {unexpected}")
    std = 1.0 / c.scaling_factor
    out.bn.running_mean.fill_(c.shift_factor)
    out.bn.running_var.fill_(std * std - BATCH_NORM_EPS)
    return out.to(vae.device, vae.dtype).eval()


def build_flux2_pipeline(vae, transformer, text_encoder, pipeline_class=FLUX2_PIPELINE):
    """``pipeline_class`` (``Flux2Pipeline``, ``Flux2KleinPipeline`` or a subclass) on the world models; the world
    text encoder and its tokenizer fill the text slots (the stock prompt path formats chat prompts for Mistral /
    Qwen3: world prompts go in as embeddings, :func:`flux2_conditioning`)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from ...world.tokenizer import world_tokenizer
    from .scheduler import SCHEDULER_CONFIG

    if not isinstance(vae, AutoencoderKLFlux2):
        vae = flux2_vae(vae)
    tokenizer = world_tokenizer(text_encoder.config.vocabulary, text_encoder.config.max_length)
    return pipeline_class(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )


def flux2_conditioning(pipe, captions, guidance=None) -> dict:
    """Prompt keyword arguments for ``pipe(...)`` on world ``captions``: ``prompt_embeds``; with ``guidance`` on a
    pipeline with true CFG (``Flux2KleinPipeline``), the empty caption's embeddings as the negative and
    ``guidance_scale``. ``Flux2Pipeline`` has no true CFG and the world model no guidance embedding: there
    ``guidance`` is not applied (``guidance_scale`` is left at its default, which the transformer ignores)."""
    stock = next(cls for cls in type(pipe).__mro__ if cls.__module__.startswith("diffusers."))
    true_cfg = guidance is not None and "negative_prompt_embeds" in inspect.signature(stock.__call__).parameters
    device, dtype = pipe.transformer.device, pipe.transformer.dtype
    kwargs = {"prompt_embeds": pipe.text_encoder.encode_captions(list(captions), device, dtype)[0]}
    if guidance is None and not true_cfg and stock.__name__.startswith("Flux2Klein"):
        kwargs["guidance_scale"] = 1.0
    if true_cfg:
        kwargs["negative_prompt_embeds"] = pipe.text_encoder.encode_captions([""] * len(captions), device, dtype)[0]
        kwargs["guidance_scale"] = guidance
    return kwargs
