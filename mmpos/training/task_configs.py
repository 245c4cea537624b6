"""The configs of the scaffold's ``TrainingTask`` tasks (``dit``, ``camera_adapter``), torch-free: ``mmpos train
TASK --help`` and a bad value are answered before the task's module imports torch.

The choices that the torch side registers (DiT size presets, camera adapter kinds, lens models) are written here
as static tuples; ``tests/training/test_train_tasks_cli.py`` checks that they equal the registries.
"""

from __future__ import annotations

from dataclasses import dataclass

from .scaffold.config import TrainConfig, finite, in_unit_interval, non_negative, option, positive

DIT_PRESET_NAMES = tuple(f"DiT-{size}/{patch}" for size in ("B", "L", "S", "XL") for patch in (2, 4, 8))
ADAPTER_KIND_NAMES = ("plucker", "prope", "ucpe")  # mmpos.integrations.diffusers.camera_adapter.ADAPTER_KINDS
LENS_MODEL_NAMES = ("pinhole", "opencv", "unified")  # mmpos.camera.lens_augment.LENS_MODELS


@dataclass
class DiTConfig(TrainConfig):
    out: str = option("outputs/dit", "run folder (one folder every node sees)", flag="--out", aliases=("--output-dir",))
    model: str = option("DiT-S/2", "size preset", choices=DIT_PRESET_NAMES)
    tiny: bool = option(False, "a 2-block, width-64 model for CPU checks")
    pe: str = option("ape_sincos", "registered encoding (mmpos list)")
    pe_options: dict = option({}, "the encoding's options, YAML/JSON, e.g. '{\"theta\": 100}'")
    objective: str = option("epsilon", "what the model predicts", choices=("epsilon", "v_prediction", "flow"))
    data: str = option("shapes", "training images", choices=("shapes", "random", "folder"))
    data_dir: str | None = option(None, "ImageFolder root for --data folder")
    samples: int = option(100_000, "size of the procedural data set (--data shapes)", check=positive)
    vae: str | None = option(None, "AutoencoderKL path or hub id: train on its latents (x scaling_factor)")
    resolution: int = option(32, "image side in pixels", check=positive)
    num_classes: int = option(10, "classes", check=positive)
    batch_size: int = option(32, "per process (global batch: this x processes)", check=positive, resume_may_change=True)
    ema_decay: float | None = option(0.9999, "EMA decay in [0, 1) (none: no EMA)", check=in_unit_interval)
    gradient_checkpointing: bool = option(False, "recompute the blocks in the backward pass")
    checkpoint_every: int = option(1000, "updates between checkpoints", check=positive, resume_may_change=True)
    sample_steps: int = option(
        50, "sampling steps for samples.png (0: none)", check=non_negative, resume_may_change=True
    )
    guidance_scale: float = option(1.5, "classifier-free guidance of samples.png", check=finite, resume_may_change=True)


def at_least_one(value) -> str | None:
    return None if value >= 1 else "a number >= 1"


def wan_frame_count(value) -> str | None:
    """Wan's VAE keeps the first frame and packs each next 4 into one latent frame: 4k + 1 frames."""
    return None if value >= 1 and (value - 1) % 4 == 0 else "4k + 1 frames (1, 5, 9, ..., 49, 81): Wan's latent frames"


def wan_pixels(value) -> str | None:
    return None if value >= 16 and value % 16 == 0 else "a positive multiple of 16 pixels (Wan: 8x VAE, 2x2 patches)"


@dataclass
class CameraAdapterConfig(TrainConfig):
    data: str | None = option(None, "folder of clip folders (required)")
    out: str = option(
        "outputs/camera_adapter", "run folder (one folder every node sees)", flag="--out", aliases=("--output-dir",)
    )
    model: str = option("tiny", "Wan diffusers pipeline path or hub id (default: tiny offline)")
    kind: str = option("ucpe", "adapter kind", choices=ADAPTER_KIND_NAMES)
    head_dim: int | None = option(None, "adapter head dim (default: UCPE's sizing, dim / 8)")
    batch_size: int = option(
        1, "clips per process (global batch: this x processes)", check=positive, resume_may_change=True
    )
    grad_clip: float | None = option(None, "max gradient norm (none: no clipping)")
    frames: int = option(9, "video frames per sample, 4k+1", check=wan_frame_count)
    height: int = option(32, "frame height, a multiple of 16", check=wan_pixels)
    width: int = option(48, "frame width, a multiple of 16", check=wan_pixels)
    max_zoom: float = option(
        1.0,
        "random focal augmentation: centre crops up to this zoom, intrinsics scaled (UCPE-style; 1 = off)",
        check=at_least_one,
    )
    lens_models: list | None = option(
        None,
        "random camera-model augmentation: each sample re-rendered with one of "
        "these models, zoomed up to --max-zoom (default: off)",
        choices=LENS_MODEL_NAMES,
        nargs="+",
    )
    max_sequence_length: int = option(512, "text tokens", check=positive)
    bf16: bool = option(False, "bf16 mixed precision; frozen parts stored in bf16")
    gradient_checkpointing: bool = option(False, "recompute the transformer blocks in the backward pass")
