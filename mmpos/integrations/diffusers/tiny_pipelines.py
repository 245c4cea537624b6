"""Tiny random diffusers pipelines of the registered families, built offline (seeded random weights, CPU, seconds):
``mmpos tiny-pipeline FAMILY --out FOLDER`` saves one (``save_pretrained`` layout) with prompt embeddings beside it,
so ``mmpos generate`` / ``mmpos edit`` / ``DiffusionPipeline.from_pretrained`` can be tried on any family without
downloading weights. The images are noise-like; the plumbing is the real one.

    from mmpos.integrations.diffusers.tiny_parts import tiny_call
    from mmpos.integrations.diffusers.tiny_pipelines import tiny_pipeline
    recipe = tiny_pipeline("flux2", "Flux2KleinPipeline")
    pipe = recipe.build()                          # Flux2KleinPipeline with random tiny parts
    image = pipe(**tiny_call(recipe, steps=1), output_type="pt").images   # [1, 3, 32, 32]

The transformers are those of :mod:`mmpos.integrations.diffusers.families.tiny` (the conformance suite's), fitted
to a tiny VAE; a text encoder is included where one can be built tiny offline (FLUX.1, Qwen-Image, Wan), otherwise
the pipeline is saved without it and takes the prompt embeddings. The image families' recipes are here and in
``tiny_pipelines_image``; the video lineages' in ``tiny_pipelines_wan``, ``tiny_pipelines_hunyuan``,
``tiny_pipelines_ltx`` and ``tiny_pipelines_video`` (CogVideoX and Helios here); :data:`RECIPES` gathers them all.
:data:`NOT_TINY` names every registered family (and :data:`PIPELINES_NOT_TINY` every pipeline of a covered family)
that has no tiny pipeline, with why.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from . import tiny_text
from .families import tiny as tiny_models
from .tiny_parts import (
    TinyPipeline,
    cogvideox_vae,
    family_recipes,
    flow_scheduler,
    flux2_vae,
    image_input,
    kl_vae,
    masked_prompt_embeds,
    pil_image,
    pil_video,
    required_none,
    seeded,
    t5_length_prompt_embeds,
    video_input,
    width16_prompt_embeds,
)

EMBEDS_FILE = "prompt_embeds.safetensors"


# ---- VAEs -------------------------------------------------------------------------------------------------------
def flux_vae(levels: int = 4):
    """FLUX.1's tiny VAE on one latent channel: scale factor ``2 ** (levels - 1)``, 8 by default (FLUX.1's: with
    2 x 2 packing one token is 16 x 16 pixels)."""
    return kl_vae(
        levels,
        1,
        sample_size=32,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )


def _qwen_vae():
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage(
        base_dim=4,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ).eval()


# ---- FLUX.1 -----------------------------------------------------------------------------------------------------
FLUX_TEXT_DIM = tiny_models.FLUX_CONFIG["joint_attention_dim"]


def flux_transformer(kind: str = "flux", vae_scale: int = 8):
    """FLUX.1's tiny transformer on one latent channel (packed 2 x 2): Fill's input is noisy latents | masked-image
    latents | the pixel mask folded to ``vae_scale ** 2`` channels."""
    from diffusers import FluxTransformer2DModel

    packed = 4
    in_channels = {"flux": packed, "kontext": packed, "fill": 2 * packed + 4 * vae_scale**2}[kind]
    config = {**tiny_models.FLUX_CONFIG, "in_channels": in_channels, "out_channels": packed}
    return FluxTransformer2DModel(**config).eval()


def flux_components(kind: str = "flux", text_encoder: bool = True) -> dict:
    """Parts of a tiny ``FluxPipeline`` (``kind="flux"``), ``FluxFillPipeline`` or ``FluxKontextPipeline``
    (call under a seed: :func:`seeded`); ``text_encoder=False``: without CLIP and T5."""
    parts = dict(transformer=flux_transformer(kind), vae=flux_vae(), scheduler=flow_scheduler())
    if text_encoder:
        return {**parts, **tiny_text.clip_t5_components(FLUX_TEXT_DIM)}
    return {**parts, **dict.fromkeys(("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"))}


def flux_prompt_embeds(batch: int = 1, seed: int = 1) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return dict(
        prompt_embeds=torch.randn(batch, tiny_text.FLUX_TEXT_LEN, FLUX_TEXT_DIM, generator=generator),
        pooled_prompt_embeds=torch.randn(batch, FLUX_TEXT_DIM, generator=generator),
    )


# ---- FLUX.2 -----------------------------------------------------------------------------------------------------
KLEIN_TRANSFORMER = {**tiny_models.FLUX2_CONFIG, "in_channels": 16}  # 4 latent channels, packed 2 x 2


def klein_components(guidance: bool = False) -> dict:
    """Parts of a tiny FLUX.2 pipeline without text encoder (a 2-level VAE: 4 pixels per token); ``guidance``: the
    guidance-distilled ``Flux2Pipeline``'s transformer."""
    from diffusers import Flux2Transformer2DModel

    transformer = Flux2Transformer2DModel(**{**KLEIN_TRANSFORMER, "guidance_embeds": guidance}).eval()
    return dict(scheduler=flow_scheduler(), vae=flux2_vae(), text_encoder=None, tokenizer=None, transformer=transformer)


def klein_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 1) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return dict(prompt_embeds=torch.randn(batch, length, KLEIN_TRANSFORMER["joint_attention_dim"], generator=generator))


# ---- Qwen-Image -------------------------------------------------------------------------------------------------
QWEN_TRANSFORMER = dict(
    patch_size=2,
    in_channels=16,
    out_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=3,
    joint_attention_dim=16,
    guidance_embeds=False,
    axes_dims_rope=(8, 4, 4),
)


def qwen_image_components(text_encoder: bool = True, processor: bool = False) -> dict:
    """Parts of a tiny ``QwenImagePipeline``: 4-channel VAE of scale factor 8 (one token is 16 x 16 pixels, as in
    Qwen-Image); ``text_encoder``: a one-layer Qwen2.5-VL with a word-level tokenizer; ``processor``: the Edit
    pipelines' ``processor`` entry (``None``: they take prompt embeddings)."""
    from diffusers import QwenImageTransformer2DModel

    transformer = QwenImageTransformer2DModel(**QWEN_TRANSFORMER).eval()
    vae = _qwen_vae()
    text = (
        tiny_text.qwen2_5_vl_components(QWEN_TRANSFORMER["joint_attention_dim"])
        if text_encoder
        else dict(text_encoder=None, tokenizer=None)
    )
    extra = dict(processor=None) if processor else {}
    return dict(transformer=transformer, vae=vae, scheduler=flow_scheduler(), **text, **extra)


def qwen_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 1) -> dict:
    """``prompt_embeds [B, L, D]`` and ``prompt_embeds_mask [B, L]`` (the last token padded)."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, -1] = 0
    embeds = torch.randn(batch, length, QWEN_TRANSFORMER["joint_attention_dim"], generator=generator)
    return dict(prompt_embeds=embeds, prompt_embeds_mask=mask)


# ---- Z-Image, Qwen-Image 2.1 --------------------------------------------------------------------------------------
def z_image_components() -> dict:
    """Parts of a tiny ``ZImagePipeline`` (no text encoder; a one-level VAE: 2 pixels per token)."""
    vae = kl_vae(1, 4, shift_factor=0.0, scaling_factor=1.0)
    return dict(
        scheduler=flow_scheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=tiny_models.tiny_z_image().eval(),
    )


def chroma_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """``prompt_embeds [B, L, 16]`` and ``prompt_attention_mask [B, L]`` (the last token padded; float, as Chroma's
    own prompt encoder returns it)."""
    mask = torch.ones(batch, length)
    mask[:, -1] = 0
    return dict(width16_prompt_embeds(batch, length, seed), prompt_attention_mask=mask)


def qwen21_components() -> dict:
    """Parts of a tiny ``QwenImage21Pipeline``: no text encoder, a word-level Qwen3-VL processor, a 3-channel VAE
    with the model's 16x spatial factor (one token is 16 x 16 pixels)."""
    from diffusers import AutoencoderKLQwenImage21

    vae = AutoencoderKLQwenImage21(
        base_dim=4,
        decoder_base_dim=4,
        z_dim=4,
        dim_mult=[1, 1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True, True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
        in_channels=3,
        out_channels=3,
    ).eval()
    return dict(
        scheduler=flow_scheduler(),
        vae=vae,
        text_encoder=None,
        processor=tiny_text.qwen3_vl_processor(),
        transformer=tiny_models.tiny_qwen21().eval(),
    )


# ---- Chroma -----------------------------------------------------------------------------------------------------
def chroma_components() -> dict:
    """Parts of a tiny Chroma pipeline: the conformance transformer (4 packed channels) on FLUX.1's tiny VAE."""
    return dict(
        scheduler=flow_scheduler(),
        vae=flux_vae(),
        text_encoder=None,
        tokenizer=None,
        transformer=tiny_models.tiny_chroma().eval(),
    )


# ---- FLUX.1-like pipelines: the family's transformer on FLUX.1's VAE, everything else None ----------------------------
def flux_like_components(pipeline: str, transformer) -> dict:
    """``pipeline``'s parts: ``transformer`` (4 input channels: one latent channel packed 2 x 2), FLUX.1's tiny VAE,
    a flow-matching scheduler, and ``None`` for its other components (text encoders, tokenizers, image encoders)."""
    return {
        **required_none(pipeline),
        "transformer": transformer.eval(),
        "vae": flux_vae(),
        "scheduler": flow_scheduler(),
    }


# ---- Helios -----------------------------------------------------------------------------------------------------
def helios_components() -> dict:
    """Parts of a tiny ``HeliosPipeline``: the conformance transformer on Wan's tiny VAE, a one-stage
    ``HeliosScheduler`` (the non-pyramid pipeline's), no UMT5 text encoder (prompt embeddings)."""
    from diffusers import HeliosScheduler

    from mmpos.models.tiny_wan import tiny_wan_vae

    return {
        **required_none("HeliosPipeline"),
        "transformer": tiny_models.tiny_helios().eval(),
        "vae": tiny_wan_vae(),
        "scheduler": HeliosScheduler(stages=1, stage_range=[0, 1]),
    }


# ---- CogVideoX --------------------------------------------------------------------------------------------------
def cogvideox_components(conditioned: bool = False) -> dict:
    """Parts of a tiny CogVideoX 1.5 pipeline: the conformance transformer (``conditioned``: taking the image or
    control latents concatenated on channels, 8 in), a 4-level ``AutoencoderKLCogVideoX`` (8 pixels and 4 frames per
    latent), a DDIM scheduler, no T5 text encoder (prompt embeddings)."""
    from diffusers import CogVideoXDDIMScheduler, CogVideoXTransformer3DModel

    config = {**tiny_models.COGVIDEOX_CONFIG, "in_channels": 8 if conditioned else 4}
    transformer = CogVideoXTransformer3DModel(**config).eval()
    return dict(
        tokenizer=None,
        text_encoder=None,
        vae=cogvideox_vae(),
        transformer=transformer,
        scheduler=CogVideoXDDIMScheduler(),
    )


def cogvideox_prompt_embeds(batch: int = 1, seed: int = 3) -> dict:
    """``prompt_embeds [B, 8, 8]`` for the tiny CogVideoX (:func:`~.tiny_parts.t5_length_prompt_embeds`)."""
    return t5_length_prompt_embeds(tiny_models.COGVIDEOX_CONFIG, batch, seed)


# ---- HunyuanDiT -------------------------------------------------------------------------------------------------
def hunyuandit_components(pipeline: str = "HunyuanDiTPipeline") -> dict:
    """Parts of a tiny ``HunyuanDiTPipeline`` (or ``pipeline``): the conformance transformer (patch 16), a 4-level VAE
    (8 pixels per latent, as the pipeline's rotary grid assumes: 512 pixels are 4 tokens), DDPM, no BERT / T5 text
    encoders (prompt embeddings) and no safety checker."""
    from diffusers import DDPMScheduler

    return {
        **required_none(pipeline),
        "transformer": tiny_models.tiny_hunyuandit().eval(),
        "vae": kl_vae(4, 4),
        "scheduler": DDPMScheduler(),
        "requires_safety_checker": False,
    }


def hunyuandit_prompt_embeds(batch: int = 1, seed: int = 3) -> dict:
    """BERT ``prompt_embeds [B, 4, 8]`` and T5 ``prompt_embeds_2 [B, 4, 8]`` (the transformer's text lengths), each
    with its attention mask (the last token padded)."""
    generator = torch.Generator().manual_seed(seed)
    length, width = (tiny_models.HUNYUANDIT_CONFIG[key] for key in ("text_len", "cross_attention_dim"))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, -1] = 0
    return dict(
        prompt_embeds=torch.randn(batch, length, width, generator=generator),
        prompt_attention_mask=mask,
        prompt_embeds_2=torch.randn(batch, length, width, generator=generator),
        prompt_attention_mask_2=mask.clone(),
    )


# ---- HiDream ----------------------------------------------------------------------------------------------------
def hidream_components() -> dict:
    """Parts of a tiny ``HiDreamImagePipeline``: a one-level VAE (one pixel per latent: the pipeline resizes every
    request to 128 x 128 latents, so the output is 128 x 128), the conformance transformer with ``max_resolution``
    widened to those 64 x 64 patches, no CLIP / T5 / Llama text encoders (prompt embeddings)."""
    from diffusers import HiDreamImageTransformer2DModel

    transformer = HiDreamImageTransformer2DModel(**{**tiny_models.HIDREAM_CONFIG, "max_resolution": (128, 128)})
    return {
        **required_none("HiDreamImagePipeline"),
        "transformer": transformer.eval(),
        "vae": kl_vae(1, 4, shift_factor=0.0, scaling_factor=1.0),
        "scheduler": flow_scheduler(),
    }


def hidream_prompt_embeds(batch: int = 1, length: int = 3, seed: int = 3) -> dict:
    """T5 ``prompt_embeds_t5 [B, L, 8]``, the two Llama layers ``prompt_embeds_llama3 [2, B, L, 4]`` (layer first,
    as HiDream's pipeline takes them) and CLIP's ``pooled_prompt_embeds [B, 8]``."""
    generator = torch.Generator().manual_seed(seed)
    return dict(
        prompt_embeds_t5=torch.randn(batch, length, 8, generator=generator),
        prompt_embeds_llama3=torch.randn(2, batch, length, 4, generator=generator),
        pooled_prompt_embeds=torch.randn(batch, 8, generator=generator),
    )


# ---- Lumina 2, CogView4: the conformance transformer on a 4-channel KL VAE, no text encoder ----------------------
def lumina2_components() -> dict:
    """Parts of a tiny ``Lumina2Pipeline``: a 4-level VAE (the pipeline assumes 8 pixels per latent)."""
    vae = kl_vae(4, 4, shift_factor=0.0, scaling_factor=1.0)
    return dict(
        transformer=tiny_models.tiny_lumina2().eval(),
        vae=vae,
        scheduler=flow_scheduler(),
        text_encoder=None,
        tokenizer=None,
    )


def cogview4_components(control: bool = False) -> dict:
    """Parts of a tiny ``CogView4Pipeline``: a 2-level VAE (2 pixels per latent), CogView4's dynamically shifted
    flow-matching scheduler (linear time shift); ``control``: ``CogView4ControlPipeline``'s transformer, taking the
    control image's latents concatenated on channels (8 in)."""
    from diffusers import CogView4Transformer2DModel

    config = {**tiny_models.COGVIEW4_CONFIG, "in_channels": 8 if control else 4}
    scheduler = flow_scheduler(
        use_dynamic_shifting=True, time_shift_type="linear", base_shift=0.25, max_shift=0.75, base_image_seq_len=256
    )
    return dict(
        transformer=CogView4Transformer2DModel(**config).eval(),
        vae=kl_vae(2, 4, shift_factor=0.0, scaling_factor=1.0),
        scheduler=scheduler,
        text_encoder=None,
        tokenizer=None,
    )


# ---- inputs of the image-conditioned pipelines --------------------------------------------------------------------
def _inpaint(side: int) -> dict:
    from PIL import Image

    mask = Image.new("L", (side, side), 0)
    mask.paste(255, (side // 4, side // 4, 3 * side // 4, 3 * side // 4))
    return dict(image=pil_image(side, side), mask_image=mask)


def _kontext(side: int) -> dict:
    return dict(image=pil_image(side, side), max_area=side**2)  # else Kontext resizes to ~1024^2 pixels


def _control(side: int) -> dict:
    return dict(control_image=pil_image(side, side))


def _control_video(side: int) -> dict:
    return dict(control_video=pil_video(side))


def _flux_like(family: str, pipeline: str, transformer, call: dict) -> TinyPipeline:
    parts = seeded(lambda: flux_like_components(pipeline, transformer()))
    return TinyPipeline(family, pipeline, parts, width16_prompt_embeds, 32, call=call)


def _recipes() -> list[TinyPipeline]:
    from . import (  # their recipes
        tiny_pipelines_hunyuan,
        tiny_pipelines_image,
        tiny_pipelines_ltx,
        tiny_pipelines_video,
        tiny_pipelines_wan,
    )

    no_cfg = dict(guidance_scale=1.0)  # classifier-free guidance would encode an empty negative prompt
    flux = family_recipes(
        "flux", flux_components, flux_prompt_embeds, 32, call=dict(max_sequence_length=tiny_text.FLUX_TEXT_LEN)
    )
    flux2 = family_recipes("flux2", klein_components, klein_prompt_embeds, 32, call=no_cfg)
    qwen = family_recipes("qwen", lambda: qwen_image_components(text_encoder=False), qwen_prompt_embeds, 64)
    qwen_edit = lambda: qwen_image_components(text_encoder=False, processor=True)  # noqa: E731
    z_image = family_recipes("z_image", z_image_components, width16_prompt_embeds, 8, call=dict(guidance_scale=0.0))
    chroma = family_recipes("chroma", chroma_components, chroma_prompt_embeds, 32, call=no_cfg)
    cogvideox = family_recipes("cogvideox", cogvideox_components, cogvideox_prompt_embeds, 64, frames=5, call=no_cfg)
    conditioned = lambda: cogvideox_components(conditioned=True)  # noqa: E731
    hunyuandit_call = dict(no_cfg, use_resolution_binning=False)  # not resized to its trained sizes
    hunyuandit = family_recipes(
        "hunyuandit", hunyuandit_components, hunyuandit_prompt_embeds, 512, call=hunyuandit_call
    )
    cogview4 = family_recipes("cogview4", cogview4_components, width16_prompt_embeds, 32, call=no_cfg)
    return [
        flux("FluxPipeline"),
        flux("FluxFillPipeline", lambda: flux_components("fill"), inputs=_inpaint),
        flux("FluxKontextPipeline", lambda: flux_components("kontext"), inputs=_kontext),
        flux2("Flux2Pipeline", lambda: klein_components(guidance=True), call={}),
        flux2("Flux2KleinPipeline"),
        flux2("Flux2KleinInpaintPipeline", inputs=_inpaint),
        qwen("QwenImagePipeline"),
        qwen("QwenImageImg2ImgPipeline", inputs=image_input),
        qwen("QwenImageInpaintPipeline", inputs=_inpaint),
        qwen("QwenImageEditPipeline", qwen_edit, inputs=image_input),
        qwen("QwenImageEditPlusPipeline", qwen_edit, inputs=image_input),
        z_image("ZImagePipeline"),
        z_image("ZImageImg2ImgPipeline", inputs=image_input),
        z_image("ZImageInpaintPipeline", inputs=_inpaint),
        TinyPipeline("qwenimage21", "QwenImage21Pipeline", seeded(qwen21_components), width16_prompt_embeds, 64),
        chroma("ChromaPipeline"),
        chroma("ChromaImg2ImgPipeline", inputs=image_input),
        _flux_like(
            "ovis_image", "OvisImagePipeline", tiny_models.tiny_ovis_image, dict(no_cfg, max_sequence_length=256)
        ),
        _flux_like("bria", "BriaPipeline", tiny_models.tiny_bria, no_cfg),
        # one chunk of 9 latent frames whatever num_frames: 33 frames
        TinyPipeline(
            "helios", "HeliosPipeline", seeded(helios_components), width16_prompt_embeds, 32, frames=5, call=no_cfg
        ),
        cogvideox("CogVideoXPipeline"),
        cogvideox("CogVideoXImageToVideoPipeline", conditioned, inputs=image_input),
        cogvideox("CogVideoXVideoToVideoPipeline", frames=None, inputs=video_input, call=dict(no_cfg, strength=1.0)),
        cogvideox(
            "CogVideoXFunControlPipeline", conditioned, frames=None, inputs=_control_video
        ),  # frames: the video's
        hunyuandit("HunyuanDiTPipeline"),
        TinyPipeline(
            "hidream", "HiDreamImagePipeline", seeded(hidream_components), hidream_prompt_embeds, 128, call=no_cfg
        ),
        TinyPipeline("lumina2", "Lumina2Pipeline", seeded(lumina2_components), masked_prompt_embeds, 32, call=no_cfg),
        cogview4("CogView4Pipeline"),
        cogview4("CogView4ControlPipeline", lambda: cogview4_components(control=True), inputs=_control),
        *tiny_pipelines_image.recipes(),
        *tiny_pipelines_video.recipes(),
        *tiny_pipelines_wan.recipes(),
        *tiny_pipelines_hunyuan.recipes(),
        *tiny_pipelines_ltx.recipes(),
    ]


RECIPES: dict[str, dict[str, TinyPipeline]] = {}
for _recipe in _recipes():
    RECIPES.setdefault(_recipe.family, {})[_recipe.pipeline] = _recipe

_NEEDS_RECIPE = (
    "no tiny pipeline written yet: its transformer is tiny (families/tiny.py) but its VAE, text inputs and call are not"
)
_MODULAR = (
    "a modular pipeline (assembled from blocks, loaded with ModularPipeline.from_pretrained): not built tiny here"
)
# registered family -> why it has no tiny pipeline here (every family is in RECIPES or here: a test checks it)
NOT_TINY: dict[str, str] = {
    "longcat_image": "LongCatImagePipeline.encode_prompt reads len(prompt) even when given prompt_embeds (diffusers "
    "0.42.1): it needs its Qwen2.5-VL text encoder and processor, not built tiny here",
    "minimax_h3": f"its one pipeline, MiniMaxH3ModularPipeline, is {_MODULAR}",
    "flux3": f"its pipelines, Flux3ModularPipeline and Flux3DistilledModularPipeline, are each {_MODULAR}",
    "wan_animate2": "no diffusers pipeline uses WanAnimate2Transformer3DModel (0.42.1)",
    "bria_fibo": "BriaFiboPipeline and BriaFiboEditPipeline take no prompt embeddings (diffusers 0.42.1): they "
    "need their SmolLM3 text encoder and tokenizer, not built tiny here",
    "cosmos": "each of its pipelines builds a CosmosSafetyChecker when given none, which needs the cosmos_guardrail "
    f"package (not installed); AnimaModularPipeline is {_MODULAR}",
    "cosmos3": "Cosmos3OmniPipeline takes prompt strings only (no prompt embeddings): it needs its text tokenizer's "
    "chat template, not built tiny here",
    "allegro": "AutoencoderKLAllegro decodes only in tiles of 24 frames x sample_size pixels overlapping by 120 x 80 "
    "pixels (diffusers 0.42.1: 'Decoding without tiling has not been implemented yet'): the smallest video it "
    "decodes is 24 frames of more than 120 x 120 pixels, not tiny",
    "joyimage": "JoyImageEditPipeline resizes every request to a bucket of its trained size (JoyImageEditImageProcessor's "
    "basesize 1024, fixed by the pipeline: a 32 x 32 request runs at 1024 x 1024): not tiny",
    "joyimage_edit_plus": "JoyImageEditPlusPipeline resizes its images to buckets of its trained size "
    "(JoyImageEditImageProcessor's basesize 1024, fixed by the pipeline): not tiny",
    "ideogram4": "Ideogram4Pipeline takes prompt strings only (no prompt embeddings): it needs its text encoder and "
    "tokenizer, not built tiny here",
}
_UNIPC = "steps its scheduler with integer indices: needs a flow-matching UniPCMultistepScheduler (not written)"
_KANDINSKY5_SIZES = "resizes every request to one of its trained sizes (1024 x 1024, 640 x 1408, ...): not tiny"
# pipeline of a family in RECIPES -> why it is not built tiny
PIPELINES_NOT_TINY: dict[str, str] = {
    "ZImageControlNetPipeline": "needs a ZImageControlNetModel fitted to the transformer's layers (not written)",
    "ZImageControlNetInpaintPipeline": "needs a ZImageControlNetModel fitted to the transformer's layers (not written)",
    "ZImageOmniPipeline": "needs a SigLIP image encoder and processor (no tiny one written)",
    "ChromaInpaintPipeline": "diffusers 0.42.1's pipeline reads transformer.config.guidance_embeds, which "
    "ChromaTransformer2DModel has not: it fails on every Chroma model",
    "SkyReelsV2ImageToVideoPipeline": "needs a CLIP image encoder fitted to the transformer (not written)",
    "SkyReelsV2DiffusionForcingPipeline": _UNIPC,
    "SkyReelsV2DiffusionForcingImageToVideoPipeline": _UNIPC,
    "SkyReelsV2DiffusionForcingVideoToVideoPipeline": _UNIPC,
    "HunyuanVideo15ImageToVideoPipeline": "needs a SigLIP image encoder and processor (no tiny one written)",
    "HunyuanVideoImageToVideoPipeline": "its Llava text encoder puts the image's tokens into the prompt embeddings "
    "and its transformer takes the image latents and a mask on channels (neither written tiny)",
    "Kandinsky5T2IPipeline": _KANDINSKY5_SIZES,
    "Kandinsky5I2IPipeline": _KANDINSKY5_SIZES,
    "LTX2ConditionPipeline": "takes LTX2VideoCondition objects and a second (audio) scheduler (not written)",
    "LTX2InContextPipeline": "needs IC-LoRA reference videos and a second (audio) scheduler (not written)",
    "LTX2HDRPipeline": "needs an hdr_transform, reference videos and a second (audio) scheduler (not written)",
    "LTX2DFRPipeline": "needs its keyframe-layout conditions (not written)",
    "LTX2DFRTemporalRefinePipeline": "needs a temporal latent upsampler and LTX2DFRPipeline's keyframe latents "
    "(not written)",
    "HeliosPyramidPipeline": "runs a three-stage HeliosScheduler pyramid (not written)",
    "HeliosModularPipeline": _MODULAR,
    "HeliosPyramidModularPipeline": _MODULAR,
    "HunyuanDiTPAGPipeline": "with prompt embeddings and no negatives its perturbed-attention step fails on a batch "
    "mismatch (2 vs 3) in diffusers 0.42.1 (not investigated further)",
    "HunyuanDiTControlNetPipeline": "needs a HunyuanDiT2DControlNetModel fitted to the transformer (not written)",
    "EasyAnimateControlPipeline": "its transformer takes the control video's latents concatenated on channels (a "
    "second tiny EasyAnimate config, not written)",
    "EasyAnimateInpaintPipeline": "its transformer takes the mask and the masked video's latents concatenated on "
    "channels (a second tiny EasyAnimate config, not written)",
    "LucyEditPipeline": "its transformer takes the video latents concatenated on channels (a second tiny Wan config)",
}


def not_tiny_reason(family: str) -> str | None:
    """Why ``family`` has no tiny pipeline (``None``: it has); a registered family not named anywhere gets the
    generic reason."""
    if family in RECIPES:
        return None
    return NOT_TINY.get(family, _NEEDS_RECIPE)


def tiny_pipeline(family: str, pipeline: str | None = None) -> TinyPipeline:
    """The recipe of ``family``'s ``pipeline`` (default: its first); ``ValueError`` naming the registered families
    (unknown ``family``), saying why (a family or pipeline with none) or naming the family's tiny pipelines."""
    from .families import FAMILIES, list_families

    if family not in list_families():
        raise ValueError(f"unknown diffusers family {family!r}; expected one of {', '.join(list_families())}")
    reason = not_tiny_reason(family)
    if reason is not None:
        raise ValueError(f"family {family!r} has no tiny pipeline: {reason}")
    recipes = RECIPES[family]
    if pipeline is None:
        return next(iter(recipes.values()))
    if pipeline in recipes:
        return recipes[pipeline]
    if pipeline in PIPELINES_NOT_TINY:
        raise ValueError(f"--pipeline {pipeline}: not built tiny: {PIPELINES_NOT_TINY[pipeline]}")
    known = ", ".join(FAMILIES[family].pipelines)
    raise ValueError(
        f"--pipeline {pipeline}: not a pipeline of family {family!r}; its tiny pipelines are {', '.join(recipes)} "
        f"(its pipelines: {known})"
    )


def save_tiny_pipeline(recipe: TinyPipeline, folder, prompts: int = 1) -> Path:
    """Save ``recipe``'s pipeline into ``folder`` (``save_pretrained``) with its prompt embeddings for ``prompts``
    prompts in ``folder/prompt_embeds.safetensors``; returns ``folder``."""
    import diffusers
    from safetensors.torch import save_file

    folder = Path(folder)
    level = diffusers.logging.get_verbosity()
    diffusers.logging.set_verbosity(logging.ERROR)  # "text_encoder=None cannot be saved", once per component
    try:
        recipe.build().save_pretrained(folder)
    finally:
        diffusers.logging.set_verbosity(level)
    tensors = {key: value.contiguous() for key, value in recipe.prompt_embeds(prompts).items()}
    save_file(tensors, str(folder / EMBEDS_FILE))
    return folder
