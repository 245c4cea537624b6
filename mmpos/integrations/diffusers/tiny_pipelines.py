"""Tiny random diffusers pipelines of the registered families, built offline (seeded random weights, CPU, seconds):
``mmpos tiny-pipeline FAMILY --out FOLDER`` saves one (``save_pretrained`` layout) with prompt embeddings beside it,
so ``mmpos generate`` / ``mmpos edit`` / ``DiffusionPipeline.from_pretrained`` can be tried on any family without
downloading weights. The images are noise-like; the plumbing is the real one.

    from mmpos.integrations.diffusers.tiny_pipelines import tiny_pipeline, tiny_call
    recipe = tiny_pipeline("flux2", "Flux2KleinPipeline")
    pipe = recipe.build()                          # Flux2KleinPipeline with random tiny parts
    image = pipe(**tiny_call(recipe, steps=1), output_type="pt").images   # [1, 3, 32, 32]

The transformers are those of :mod:`mmpos.integrations.diffusers.families.tiny` (the conformance suite's), fitted
to a tiny VAE; a text encoder is included where one can be built tiny offline (FLUX.1, Qwen-Image, Wan), otherwise
the pipeline is saved without it and takes the prompt embeddings. :data:`NOT_TINY` names every registered family
(and :data:`PIPELINES_NOT_TINY` every pipeline of a covered family) that has no tiny pipeline here, with why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import tiny_text
from .families import tiny as tiny_models

EMBEDS_FILE = "prompt_embeds.safetensors"


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


# ---- VAEs -------------------------------------------------------------------------------------------------------
def _kl_vae(levels: int, latent_channels: int, **config):
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


def flux_vae(levels: int = 4):
    """FLUX.1's tiny VAE on one latent channel: scale factor ``2 ** (levels - 1)``, 8 by default (FLUX.1's: with
    2 x 2 packing one token is 16 x 16 pixels)."""
    return _kl_vae(
        levels,
        1,
        sample_size=32,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )


def _flux2_vae():
    from diffusers import AutoencoderKLFlux2

    return AutoencoderKLFlux2(
        block_out_channels=(8, 8),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
    ).eval()


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


def seeded(build: Callable[[], dict], seed: int = 0) -> Callable[[], dict]:
    """``build`` run under ``torch.manual_seed(seed)``, the caller's RNG state restored."""

    def built() -> dict:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return build()

    return built


def _flow_scheduler(**config):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**config)


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
    parts = dict(transformer=flux_transformer(kind), vae=flux_vae(), scheduler=_flow_scheduler())
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
    return dict(
        scheduler=_flow_scheduler(), vae=_flux2_vae(), text_encoder=None, tokenizer=None, transformer=transformer
    )


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
    return dict(transformer=transformer, vae=vae, scheduler=_flow_scheduler(), **text, **extra)


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
    vae = _kl_vae(1, 4, shift_factor=0.0, scaling_factor=1.0)
    return dict(
        scheduler=_flow_scheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=tiny_models.tiny_z_image().eval(),
    )


def width16_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """``prompt_embeds [B, L, 16]``, no mask (Z-Image, Qwen-Image 2.1)."""
    return dict(prompt_embeds=torch.randn(batch, length, 16, generator=torch.Generator().manual_seed(seed)))


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
        scheduler=_flow_scheduler(),
        vae=vae,
        text_encoder=None,
        processor=tiny_text.qwen3_vl_processor(),
        transformer=tiny_models.tiny_qwen21().eval(),
    )


# ---- Chroma -----------------------------------------------------------------------------------------------------
def chroma_components() -> dict:
    """Parts of a tiny Chroma pipeline: the conformance transformer (4 packed channels) on FLUX.1's tiny VAE."""
    return dict(
        scheduler=_flow_scheduler(),
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
        **_required_none(pipeline),
        "transformer": transformer.eval(),
        "vae": flux_vae(),
        "scheduler": _flow_scheduler(),
    }


def _required_none(pipeline: str) -> dict:
    """``{name: None}`` for every component ``pipeline``'s ``__init__`` requires."""
    import inspect

    import diffusers

    init = inspect.signature(getattr(diffusers, pipeline).__init__).parameters
    return {name: None for name, p in init.items() if name != "self" and p.default is inspect.Parameter.empty}


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
        scheduler=_flow_scheduler(),
        text_encoder=None,
        tokenizer=None,
    )


def ltx_prompt_embeds(batch: int = 1, length: int = 5, seed: int = 3) -> dict:
    """``prompt_embeds [B, L, 16]`` and ``prompt_attention_mask [B, L]`` (the last token padded)."""
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, -1] = 0
    return dict(width16_prompt_embeds(batch, length, seed), prompt_attention_mask=mask)


# ---- Wan --------------------------------------------------------------------------------------------------------
def wan_components(image_to_video: bool = False) -> dict:
    from mmpos.models.tiny_wan import tiny_wan_components

    return tiny_wan_components(image_to_video=image_to_video)


def wan_like_components(pipeline: str, transformer) -> dict:
    """``pipeline``'s parts for a Wan-lineage ``transformer`` (4 latent channels, text width 16): Wan's tiny VAE, a
    flow-matching scheduler (shift 3) and ``None`` for its text encoder and tokenizer (prompt embeddings)."""
    from mmpos.models.tiny_wan import tiny_wan_vae

    others = _required_none(pipeline)
    return {**others, "transformer": transformer.eval(), "vae": tiny_wan_vae(), "scheduler": _flow_scheduler(shift=3.0)}


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


def wan_prompt_embeds(batch: int = 1, length: int = 6, seed: int = 1) -> dict:
    from mmpos.models.tiny_wan import TEXT_DIM

    return dict(prompt_embeds=torch.randn(batch, length, TEXT_DIM, generator=torch.Generator().manual_seed(seed)))


# ---- inputs of the image-conditioned pipelines --------------------------------------------------------------------
def pil_image(height: int, width: int, seed: int = 2):
    """A smooth random RGB PIL image (the edit pipelines read ``image.size``)."""
    import numpy as np
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(1, 3, max(1, height // 8), max(1, width // 8), generator=generator)
    fine = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    return Image.fromarray((fine[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))


def _image(side: int) -> dict:
    return dict(image=pil_image(side, side))


def _inpaint(side: int) -> dict:
    from PIL import Image

    mask = Image.new("L", (side, side), 0)
    mask.paste(255, (side // 4, side // 4, 3 * side // 4, 3 * side // 4))
    return dict(image=pil_image(side, side), mask_image=mask)


def _kontext(side: int) -> dict:
    return dict(image=pil_image(side, side), max_area=side**2)  # else Kontext resizes to ~1024^2 pixels


def _video(side: int, frames: int = 5) -> dict:
    return dict(video=[pil_image(side, side, seed=2 + i) for i in range(frames)])


def _family(family: str, components, prompt_embeds, side: int, **shared) -> Callable[..., TinyPipeline]:
    """``make(pipeline, components=None, **more)``: the recipe of ``family``'s ``pipeline`` (``components`` and
    ``more`` override the family's)."""

    def make(pipeline: str, parts: Callable[[], dict] | None = None, **more) -> TinyPipeline:
        return TinyPipeline(family, pipeline, seeded(parts or components), prompt_embeds, side, **{**shared, **more})

    return make


def _flux_like(family: str, pipeline: str, transformer, call: dict) -> TinyPipeline:
    parts = seeded(lambda: flux_like_components(pipeline, transformer()))
    return TinyPipeline(family, pipeline, parts, width16_prompt_embeds, 32, call=call)


def _wan_like(family: str, pipeline: str, transformer) -> TinyPipeline:
    parts = seeded(lambda: wan_like_components(pipeline, transformer()))
    return TinyPipeline(family, pipeline, parts, width16_prompt_embeds, 32, frames=5, call=dict(guidance_scale=1.0))


def _recipes() -> list[TinyPipeline]:
    no_cfg = dict(guidance_scale=1.0)  # classifier-free guidance would encode an empty negative prompt
    flux = _family(
        "flux", flux_components, flux_prompt_embeds, 32, call=dict(max_sequence_length=tiny_text.FLUX_TEXT_LEN)
    )
    flux2 = _family("flux2", klein_components, klein_prompt_embeds, 32, call=no_cfg)
    qwen = _family("qwen", lambda: qwen_image_components(text_encoder=False), qwen_prompt_embeds, 64)
    qwen_edit = lambda: qwen_image_components(text_encoder=False, processor=True)  # noqa: E731
    z_image = _family("z_image", z_image_components, width16_prompt_embeds, 8, call=dict(guidance_scale=0.0))
    chroma = _family("chroma", chroma_components, chroma_prompt_embeds, 32, call=no_cfg)
    ltx = _family("ltx", ltx_components, ltx_prompt_embeds, 32, frames=9, call=no_cfg)
    wan = _family("wan", wan_components, wan_prompt_embeds, 32, frames=5, call=no_cfg)
    return [
        flux("FluxPipeline"),
        flux("FluxFillPipeline", lambda: flux_components("fill"), inputs=_inpaint),
        flux("FluxKontextPipeline", lambda: flux_components("kontext"), inputs=_kontext),
        flux2("Flux2Pipeline", lambda: klein_components(guidance=True), call={}),
        flux2("Flux2KleinPipeline"),
        flux2("Flux2KleinInpaintPipeline", inputs=_inpaint),
        qwen("QwenImagePipeline"),
        qwen("QwenImageImg2ImgPipeline", inputs=_image),
        qwen("QwenImageInpaintPipeline", inputs=_inpaint),
        qwen("QwenImageEditPipeline", qwen_edit, inputs=_image),
        qwen("QwenImageEditPlusPipeline", qwen_edit, inputs=_image),
        z_image("ZImagePipeline"),
        z_image("ZImageImg2ImgPipeline", inputs=_image),
        z_image("ZImageInpaintPipeline", inputs=_inpaint),
        TinyPipeline("qwenimage21", "QwenImage21Pipeline", seeded(qwen21_components), width16_prompt_embeds, 64),
        chroma("ChromaPipeline"),
        chroma("ChromaImg2ImgPipeline", inputs=_image),
        _flux_like(
            "ovis_image", "OvisImagePipeline", tiny_models.tiny_ovis_image, dict(no_cfg, max_sequence_length=256)
        ),
        _flux_like("bria", "BriaPipeline", tiny_models.tiny_bria, no_cfg),
        _wan_like("skyreels_v2", "SkyReelsV2Pipeline", tiny_models.tiny_skyreels_v2),
        _wan_like("wan_vace", "WanVACEPipeline", _wan_vace_transformer),
        ltx("LTXPipeline"),
        ltx("LTXImageToVideoPipeline", inputs=_image),
        ltx("LTXConditionPipeline", inputs=_image),
        TinyPipeline(
            "chronoedit",
            "ChronoEditPipeline",
            seeded(chronoedit_components),
            width16_prompt_embeds,
            32,
            frames=5,
            inputs=_image,
            call=no_cfg,
        ),
        wan("WanPipeline"),
        wan("WanImageToVideoPipeline", lambda: wan_components(image_to_video=True), inputs=_image),
        wan("WanVideoToVideoPipeline", frames=None, inputs=_video, call=dict(no_cfg, strength=1.0)),
    ]


RECIPES: dict[str, dict[str, TinyPipeline]] = {}
for _recipe in _recipes():
    RECIPES.setdefault(_recipe.family, {})[_recipe.pipeline] = _recipe

_NEEDS_RECIPE = (
    "no tiny pipeline written yet: its transformer is tiny (families/tiny.py) but its VAE, text inputs and call are not"
)
# registered family -> why it has no tiny pipeline here (every family is in RECIPES or here: a test checks it)
NOT_TINY: dict[str, str] = {
    "longcat_image": "LongCatImagePipeline.encode_prompt reads len(prompt) even when given prompt_embeds (diffusers "
    "0.42.1): it needs its Qwen2.5-VL text encoder and processor, not built tiny here",
    "wan_animate2": "no diffusers pipeline uses WanAnimate2Transformer3DModel (0.42.1)",
}
_UNIPC = "steps its scheduler with integer indices: needs a flow-matching UniPCMultistepScheduler (not written)"
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
