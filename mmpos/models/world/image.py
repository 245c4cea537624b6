"""The world's small models, built from the real diffusers classes, and loading them as real pipelines.

- VAE: ``AutoencoderKL``, 64x64 RGB -> 32x32x4 latents (``vae_scale_factor`` 2) -> 256 packed tokens.
- Text encoder: :class:`~mmpos.models.world.text.WorldTextEncoder` (``prompt_embeds``, ``pooled_prompt_embeds``).
- Transformers: ``FluxTransformer2DModel`` for ``t2i`` (``FluxPipeline``), ``fill`` (``FluxFillPipeline``:
  packed latents + packed masked-image latents + packed pixel mask on the channel axis) and ``kontext``
  (``FluxKontextPipeline``: context tokens appended with index-axis id 1).

A checkpoint folder holds ``world-vae/`` and one diffusers pipeline folder per task, ``world-<task>/``
(``save_pretrained``: ``model_index.json``, ``transformer/``, ``vae/``, ``scheduler/``, the text encoder and its
tokenizer in both Flux text slots), so ``FluxPipeline.from_pretrained("assets/world-t2i")`` (or
``DiffusionPipeline``) loads a model that takes prompt strings. Folders written before ``model_index.json``
existed (``world-<task>/{transformer,text_encoder}/`` only) still load with :func:`load_world_pipeline`.
"""

from __future__ import annotations

import inspect
import json
import logging
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path

import torch
from diffusers import (
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    FluxFillPipeline,
    FluxKontextPipeline,
    FluxPipeline,
    FluxTransformer2DModel,
)

from ..._validation import check_choice
from ...world.tokenizer import world_tokenizer
from .flux2 import FLUX2_PIPELINE, build_flux2_pipeline, flux2_conditioning, is_flux2
from .scheduler import SCHEDULER_CONFIG
from .text import WorldTextEncoder

TASKS = ("t2i", "fill", "kontext")
PIPELINES = {"t2i": FluxPipeline, "fill": FluxFillPipeline, "kontext": FluxKontextPipeline}


def _shipped_assets() -> Path:
    """``assets/`` of a source checkout, else ``mmpos/assets`` of an installed wheel (setup.py ships it there)."""
    package = Path(__file__).resolve().parents[2]  # mmpos/ (this file is mmpos/models/world/image.py)
    checkout, installed = package.parent / "assets", package / "assets"
    return installed if (installed / "world-vae").is_dir() and not (checkout / "world-vae").is_dir() else checkout


DEFAULT_ASSETS = _shipped_assets()

VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    block_out_channels=(32, 64),
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=16,
    sample_size=64,
    scaling_factor=1.0,
    shift_factor=0.0,
    mid_block_add_attention=False,
)
TRANSFORMER_CONFIG = dict(
    patch_size=1,
    num_layers=2,
    num_single_layers=4,
    attention_head_dim=32,
    num_attention_heads=5,
    joint_attention_dim=64,
    pooled_projection_dim=64,
    guidance_embeds=False,
    axes_dims_rope=(8, 12, 12),
)


def vae_scale_factor(vae: AutoencoderKL) -> int:
    return 2 ** (len(vae.config.block_out_channels) - 1)


def transformer_channels(task: str, latent_channels: int = 4, scale_factor: int = 2) -> tuple[int, int]:
    """``(in_channels, out_channels)`` of the packed tokens for ``task``."""
    check_choice("task", task, TASKS)
    packed = 4 * latent_channels
    if task == "fill":  # noisy latents | masked-image latents | pixel mask folded to scale^2 channels, packed
        return 2 * packed + 4 * scale_factor**2, packed
    return packed, packed


def build_vae(**overrides) -> AutoencoderKL:
    return AutoencoderKL(**{**VAE_CONFIG, **overrides})


def build_transformer(task: str, latent_channels: int = 4, scale_factor: int = 2, **overrides):
    in_channels, out_channels = transformer_channels(task, latent_channels, scale_factor)
    config = {**TRANSFORMER_CONFIG, "in_channels": in_channels, "out_channels": out_channels, **overrides}
    return FluxTransformer2DModel(**config)


def build_text_encoder(transformer: FluxTransformer2DModel, **overrides) -> WorldTextEncoder:
    config = transformer.config  # FLUX.2 has no pooled input: the unused pooled output keeps the text width
    return WorldTextEncoder(
        joint_attention_dim=config.joint_attention_dim,
        pooled_projection_dim=config.get("pooled_projection_dim", config.joint_attention_dim),
        **overrides,
    )


def build_scheduler(**overrides) -> FlowMatchEulerDiscreteScheduler:
    return FlowMatchEulerDiscreteScheduler(**{**SCHEDULER_CONFIG, **overrides})


def build_pipeline(task: str, vae, transformer, text_encoder, pipeline_class=None):
    """The stock diffusers pipeline for ``task`` (or ``pipeline_class``, a subclass of it, e.g. an mmpos editing
    pipeline). ``text_encoder`` and its tokenizer fill both Flux text slots (CLIP's pooled and T5's sequence
    embeddings come from the one world encoder), so prompts go in as strings or as embeddings."""
    check_choice("task", task, TASKS)
    if is_flux2(transformer):
        return build_flux2_pipeline(vae, transformer, text_encoder, pipeline_class or FLUX2_PIPELINE)
    cls = PIPELINES[task] if pipeline_class is None else pipeline_class
    if not issubclass(cls, PIPELINES[task]):
        raise TypeError(
            f"pipeline_class={cls.__name__} does not run a {task} model: expected a subclass of "
            f"{PIPELINES[task].__name__}"
        )
    tokenizer = world_tokenizer(text_encoder.config.vocabulary, text_encoder.config.max_length)
    return cls(
        scheduler=build_scheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder,
        tokenizer_2=tokenizer,
        transformer=transformer,
    )


def stock_pipeline_class(pipe):
    """The diffusers Flux pipeline class ``pipe`` is (or derives from)."""
    for cls in type(pipe).__mro__:
        if cls in PIPELINES.values():
            return cls
    raise TypeError(f"{type(pipe).__name__} is not a FluxPipeline, FluxFillPipeline or FluxKontextPipeline")


def conditioning(pipe, captions, guidance=None) -> dict:
    """Prompt and guidance keyword arguments for ``pipe(...)`` on ``captions``.

    World text encoders get embeddings (:func:`prompt_kwargs`), real pipelines the strings. ``guidance`` (None:
    the pipeline's default) goes to ``guidance_scale`` for guidance-distilled transformers (FLUX.1-dev, Fill,
    Kontext), else to true CFG against the empty caption where the pipeline has it (world t2i and Kontext;
    the world's Fill model runs without guidance).
    """
    if is_flux2(pipe.transformer):
        return flux2_conditioning(pipe, captions, guidance)
    distilled = bool(pipe.transformer.config.guidance_embeds)
    true_cfg = (
        guidance is not None
        and not distilled
        and "true_cfg_scale" in inspect.signature(stock_pipeline_class(pipe).__call__).parameters
    )
    negatives = [""] * len(captions) if true_cfg else None
    if isinstance(pipe.text_encoder, WorldTextEncoder):
        kwargs = prompt_kwargs(pipe, captions, negatives)
    elif pipe.text_encoder is None and getattr(pipe, "text_encoder_2", None) is None:
        raise ValueError(
            "this pipeline has no text encoders: load a model folder that has text_encoder / "
            "text_encoder_2 (or pass prompt embeddings to the pipeline)"
        )
    else:
        kwargs = {"prompt": list(captions)} | ({"negative_prompt": negatives} if true_cfg else {})
    if true_cfg:
        kwargs["true_cfg_scale"] = guidance
    elif distilled and guidance is not None:
        kwargs["guidance_scale"] = guidance
    return kwargs


def prompt_kwargs(pipe, captions, negative_captions=None) -> dict:
    """``prompt_embeds``/``pooled_prompt_embeds`` (and negatives) for ``pipe(...)`` from world captions."""
    encoder = pipe.text_encoder
    device, dtype = pipe.transformer.device, pipe.transformer.dtype
    embeds, pooled = encoder.encode_captions(captions, device, dtype)
    kwargs = {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}
    if negative_captions is not None:
        negative, negative_pooled = encoder.encode_captions(negative_captions, device, dtype)
        kwargs.update(negative_prompt_embeds=negative, negative_pooled_prompt_embeds=negative_pooled)
    return kwargs


def load_pretrained(cls, folder: Path, **options):
    """``cls.from_pretrained(folder)``; a truncated or foreign file there raises ``ValueError`` naming the folder
    (safetensors' own error does not)."""
    from safetensors import SafetensorError

    try:
        return cls.from_pretrained(folder, **options)
    except (OSError, ValueError, RuntimeError, SafetensorError) as error:
        message = " ".join(str(error).split())
        raise ValueError(
            f"{folder}: cannot load this {cls.__name__} checkpoint ({type(error).__name__}: "
            f"{message}); re-export or re-download it"
        ) from None


def import_named_modules(folder) -> None:
    """Import the ``mmpos`` modules ``folder/model_index.json`` names for its components (diffusers loads classes
    only from imported modules). A name that does not import is left to diffusers' own error."""
    index = Path(folder) / "model_index.json"
    if not index.is_file():
        return
    for value in json.loads(index.read_text()).values():
        if isinstance(value, list) and value and isinstance(value[0], str) and value[0].startswith("mmpos."):
            try:
                import_module(value[0])
            except ModuleNotFoundError:
                pass


def dtype_keyword(cls) -> str:
    """``dtype`` in recent diffusers (``torch_dtype`` deprecated there), ``torch_dtype`` before."""
    source = inspect.getsource(cls.from_pretrained)
    return "dtype" if 'kwargs.pop("dtype"' in source else "torch_dtype"


def _checked_dir(path: Path, what: str) -> Path:
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"no {what} checkpoint at {path} (expected config.json and safetensors there); "
            "train one with scripts/train_world.py or pass the folder that holds "
            "world-vae/ and world-<task>/"
        )
    return path


def trained_image_size(root, task: str) -> int:
    """The image side a world model was trained at (its model card), 64 when the card does not say."""
    import json

    card = Path(root if root is not None else DEFAULT_ASSETS) / f"world-{task}" / "model_card.json"
    return int(json.loads(card.read_text())["data"]["image_size"]) if card.is_file() else 64


def check_world_checkpoint(root, tasks=TASKS) -> Path:
    """Raise a clear FileNotFoundError unless ``root`` holds the VAE and each task's model folders."""
    root = Path(root)
    _checked_dir(root / "world-vae", "VAE")
    for task in tasks:
        for part in ("transformer", "text_encoder"):
            _checked_dir(root / f"world-{task}" / part, f"{task} {part}")
    return root


@contextmanager
def world_text_encoders_accepted():
    """Silence diffusers' "Expected types for text_encoder: CLIPTextModel, got WorldTextEncoder" while loading:
    the world encoder fills both Flux text slots by design."""
    logger = logging.getLogger("diffusers.pipelines.pipeline_utils")
    accepted = lambda record: "WorldTextEncoder" not in record.getMessage()  # noqa: E731
    logger.addFilter(accepted)
    try:
        yield
    finally:
        logger.removeFilter(accepted)


def world_architecture(root, task: str) -> str:
    """``"flux2"`` when ``root/world-<task>`` is a FLUX.2 pipeline folder (its ``model_index.json`` names a
    ``Flux2*`` pipeline), else ``"flux"``."""
    import json

    index = Path(root if root is not None else DEFAULT_ASSETS) / f"world-{task}" / "model_index.json"
    name = json.loads(index.read_text()).get("_class_name", "") if index.is_file() else ""
    return "flux2" if name.startswith("Flux2") else "flux"


def load_flux2_pipeline(model_dir: Path, device="cpu", dtype=torch.float32, pipeline_class=None):
    """The FLUX.2-architecture world t2i folder as ``pipeline_class`` (default ``Flux2KleinPipeline``; any
    subclass of it or of ``Flux2Pipeline``)."""
    from diffusers import Flux2KleinPipeline, Flux2Pipeline

    cls = FLUX2_PIPELINE if pipeline_class is None else pipeline_class
    if not issubclass(cls, (Flux2Pipeline, Flux2KleinPipeline)):
        raise TypeError(
            f"{model_dir} is a FLUX.2 world model: pipeline_class={cls.__name__} does not run it, "
            "expected a subclass of Flux2KleinPipeline or Flux2Pipeline"
        )
    with world_text_encoders_accepted():
        return load_pretrained(cls, model_dir, **{dtype_keyword(cls): dtype}).to(device)


def load_world_pipeline(
    task: str, root: str | Path | None = None, device="cpu", dtype=torch.float32, pipeline_class=None
):
    """The real diffusers pipeline for ``task`` (or ``pipeline_class``, see :func:`build_pipeline`) with the
    shipped (or ``root``'s) trained world weights: ``from_pretrained`` of ``root/world-<task>``, or, for a folder
    without ``model_index.json`` (an older export), the pipeline assembled from its parts and ``root/world-vae``."""
    check_choice("task", task, TASKS)
    root = Path(root) if root is not None else DEFAULT_ASSETS
    model_dir = root / f"world-{task}"
    if world_architecture(root, task) == "flux2":
        return load_flux2_pipeline(model_dir, device, dtype, pipeline_class)
    cls = PIPELINES[task] if pipeline_class is None else pipeline_class
    if (model_dir / "model_index.json").is_file():
        import_named_modules(model_dir)
        with world_text_encoders_accepted():
            return load_pretrained(cls, model_dir, **{dtype_keyword(cls): dtype}).to(device)
    vae = load_pretrained(AutoencoderKL, _checked_dir(root / "world-vae", "VAE"), torch_dtype=dtype)
    transformer = load_pretrained(
        FluxTransformer2DModel, _checked_dir(model_dir / "transformer", task), torch_dtype=dtype
    )
    text_encoder = load_pretrained(
        WorldTextEncoder, _checked_dir(model_dir / "text_encoder", "text encoder"), torch_dtype=dtype
    )
    return build_pipeline(task, vae, transformer, text_encoder, pipeline_class).to(device)
