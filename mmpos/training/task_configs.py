"""The config of every training task (:data:`mmpos.training.tasks.TASKS`), one dataclass each, torch-free: ``mmpos
train TASK --help`` and a bad value are answered before the task's module imports torch. The scaffold's
``TrainingTask`` tasks (``dit``, ``camera_adapter``) extend :class:`~.scaffold.config.TrainConfig`; the trainers
with their own update order (``vit``, ``world_image``, ``world_video``, ``nvs``) declare their keys alike and check
them when made (:class:`CheckedConfig`).

The choices that the torch side registers (DiT size presets, camera adapter kinds, lens models) are written here
as static tuples; ``tests/training/test_train_tasks_cli.py`` checks that they equal the registries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from .scaffold.config import (
    ConfigError,
    TrainConfig,
    check_value,
    finite,
    in_unit_interval,
    non_negative,
    option,
    positive,
    read_config_file,
)

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


# ---- the world trainers: their own update order (:mod:`mmpos.training.tasks`), the same config style -----------
WORLD_IMAGE_TASK_NAMES = ("vae", "t2i", "fill", "kontext")  # "vae" + mmpos.models.world.image.TASKS
WORLD_ARCHITECTURE_NAMES = ("flux", "flux2")  # mmpos.models.world.architectures.ARCHITECTURES
VIDEO_STAGE_NAMES = ("vae", "base", "ucpe", "plucker", "prope")  # mmpos.training.tasks.world_video.STAGES
NVS_ENCODING_NAMES = ("none", "plucker", "prope", "rayrope", "ucpe")  # mmpos.models.world.nvs.NVS_ENCODINGS


class CheckedConfig:
    """A config whose every field is checked when it is made (:func:`~.scaffold.config.check_value`: the type,
    the choices, the rule), so a config made in code is refused as one read from a command line is."""

    def __post_init__(self):
        for field in fields(self):
            value = getattr(self, field.name)
            if value is None and field.default is None and "None" not in str(field.type):
                choices = field.metadata.get("choices")
                raise ConfigError(f"{field.name}: required" + (f", one of {', '.join(choices)}" if choices else ""))
            check_value(type(self), field.name, value)

    @classmethod
    def from_file(cls, path, **changes):
        """The config of the YAML file ``path`` (every key checked, an unknown one named) with ``changes`` on top
        (a run's ``config.yaml``, a shipped recipe)."""
        changes = {key: check_value(cls, key, value) for key, value in changes.items()}
        return cls(**{**read_config_file(cls, path), **changes})


def in_closed_unit_interval(value) -> str | None:
    return None if 0 <= value <= 1 else "a number in [0, 1]"


def positive_finite(value) -> str | None:
    return finite(value) or positive(value)


def non_negative_finite(value) -> str | None:
    return finite(value) or non_negative(value)


@dataclass
class WorldImageConfig(CheckedConfig):
    """The world image trainer (``mmpos train world_image``): the VAE, then the t2i / fill / kontext transformers
    on its latents. ``out`` holds ``train-<task>/checkpoint-<step>/`` and the export ``world-<task>/``."""

    out: str = option(
        "outputs/world", "output folder: world-<task>/, train-<task>/ (one every node sees)", resume_may_change=True
    )
    task: str = option("t2i", "the model trained", choices=WORLD_IMAGE_TASK_NAMES)
    image_size: int = option(64, "image side in pixels", check=positive)
    num_examples: int = option(20000, "training examples rendered", check=positive)
    data_seed: int = option(0, "seed of the rendered examples")
    workers: int = option(1, "processes rendering the examples", check=positive, resume_may_change=True)
    batch_size: int = option(64, "per process (global batch: this x processes)", check=positive)
    lr: float = option(3e-4, "learning rate (AdamW)", check=positive_finite)
    weight_decay: float = option(0.0, "AdamW weight decay", check=non_negative)
    warmup_steps: int = option(100, "linear warm-up updates", check=non_negative)
    ema_decay: float = option(0.999, "EMA decay of the exported weights", check=in_unit_interval)
    max_steps: int = option(100000, "stop after this many updates", check=positive, resume_may_change=True)
    max_minutes: float = option(
        10.0, "stop after this many minutes of training", check=positive, resume_may_change=True
    )
    mixed_precision: str = option("no", "accelerate mixed precision", choices=("no", "bf16", "fp16"))
    seed: int = option(0, "seed of the weights, batches and noise")
    log_every: int = option(50, "updates between loss lines", check=positive, resume_may_change=True)
    checkpoint_every: int = option(1000, "updates between checkpoints", check=positive, resume_may_change=True)
    caption_dropout: float = option(0.1, "captions dropped (classifier-free guidance)", check=in_closed_unit_interval)
    style_dropout: float = option(0.25, "style words dropped from a caption", check=in_closed_unit_interval)
    kl_weight: float = option(1e-6, "KL weight of the VAE loss", check=non_negative)
    sample_steps: int = option(20, "sampling steps of the exported samples", check=non_negative, resume_may_change=True)
    sample_guidance: float = option(3.0, "guidance of the exported samples", check=finite, resume_may_change=True)
    num_samples: int = option(8, "exported samples", check=positive, resume_may_change=True)
    vae_path: str | None = option(
        None, "folder with the trained world-vae/ (t2i / fill / kontext)", flag="--vae", resume_may_change=True
    )
    init_from: str | None = option(None, "a finished run's folder whose weights start this one (continued training)")
    transformer: dict = option({}, "transformer options, YAML", flag="--transformer-options")
    text_encoder: dict = option({}, "text encoder options, YAML", flag="--text-encoder-options")
    vae: dict = option({}, "VAE options, YAML (task vae)", flag="--vae-options")
    architecture: str = option("flux", "transformer architecture", choices=WORLD_ARCHITECTURE_NAMES)
    device: str | None = option(
        None, "force the device (none: accelerate's)", choices=("cpu", "cuda"), resume_may_change=True
    )
    quiet: bool = option(False, "print losses as lines instead of a progress bar", resume_may_change=True)


@dataclass
class WorldVideoConfig(CheckedConfig):
    """One stage of the world video model (``mmpos train world_video``): ``vae``, ``base``, then a camera adapter
    (``ucpe`` / ``plucker`` / ``prope``) on the frozen base. ``out`` is the stage's run folder."""

    stage: str = option(None, "the stage trained", choices=VIDEO_STAGE_NAMES)
    out: str = option(
        "outputs/world_video",
        "run folder: checkpoints, clips cache, export (one every node sees)",
        resume_may_change=True,
    )
    vae: str | None = option(
        None, "AutoencoderKL folder (the vae stage starts from it; none: assets/world-vae)", resume_may_change=True
    )
    base: str | None = option(None, "trained transformer folder (the camera stages)", resume_may_change=True)
    steps: int = option(3000, "optimizer updates", check=positive)
    batch_size: int = option(8, "clips per process (global batch: this x processes)", check=positive)
    lr: float = option(5e-4, "peak learning rate (warm-up, then cosine)", check=positive_finite)
    warmup: int = option(100, "linear warm-up updates", check=non_negative)
    seed: int = option(0, "seed of the weights, batches and noise")
    train_scenes: int = option(600, "training scenes", check=positive, flag="--scenes")
    clips_per_scene: int = option(4, "clips rendered per scene", check=positive)
    checkpoint_every: int = option(200, "updates between checkpoints", check=positive, resume_may_change=True)
    init_from: str | None = option(
        None, "a finished run folder of the same stage whose weights start this one (continued training)"
    )
    max_minutes: float = option(float("inf"), "wall-clock budget of this call", check=positive, resume_may_change=True)
    size: int = option(32, "clip frame size in pixels (square)", check=positive)
    frames: int = option(9, "frames per clip", check=positive)
    device: str = option("cpu", "where the models train (cuda on a GPU)", resume_may_change=True)
    threads: int | None = option(None, "torch CPU threads (none: torch's)", check=positive, resume_may_change=True)


@dataclass
class NVSConfig(CheckedConfig):
    """One run of the novel-view benchmark (``mmpos train nvs``): the transformer of one camera encoding, trained
    on ``data`` (``python scripts/eval_nvs.py data``) into the run folder ``out`` (the benchmark's layout:
    ``<benchmark>/<checkpoints>/<encoding>_s<seed>/``)."""

    encoding: str = option(None, "camera encoding", choices=NVS_ENCODING_NAMES)
    out: str = option("outputs/nvs/checkpoints/run", "run folder (one every node sees)", resume_may_change=True)
    data: str = option(
        "outputs/nvs/data.pt", "the benchmark's triples (python scripts/eval_nvs.py data)", resume_may_change=True
    )
    seed: int = option(0, "seed of the weights and batches")
    steps: int = option(450, "optimizer updates", check=positive)
    batch_size: int = option(8, "triples per process (global batch: this x processes)", check=positive)
    lr: float = option(
        1e-3, "peak learning rate (warm-up, then cosine; 0 keeps the weights)", check=non_negative_finite
    )
    warmup: int = option(50, "linear warm-up updates", check=non_negative)
    weight_decay: float = option(0.01, "AdamW weight decay of the matrices", check=non_negative_finite)
    dim: int = option(96, "width", check=positive)
    depth: int = option(4, "blocks", check=positive)
    heads: int = option(2, "attention heads", check=positive)
    checkpoint_every: int = option(100, "updates between checkpoints", check=positive, resume_may_change=True)
    init_from: str | None = option(
        None, "a finished run of the same encoding whose weights start this one (continued training)"
    )


# ---- the ViT trainer (``mmpos train vit``): timm's factories, its own update order --------------------------
VIT_SCHEDULERS = ("cosine", "tanh", "step", "multistep", "constant", "poly")  # timm's per-update schedules
VIT_EXTRAPOLATIONS = ("none", "pi", "ntk", "yarn")  # mmpos.training.vit_eval.EXTRAPOLATIONS
VIT_INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "box", "hamming", "lanczos", "random")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def numbers(expected: str, each, length: int | None = None, ordered: bool = False):
    """The rule of a list field: ``length`` finite numbers (any number if None), each passing ``each``, in
    non-decreasing order if ``ordered``; ``expected`` is what an error says was expected."""

    def check(value) -> str | None:
        ok = (
            len(value) > 0
            and (length is None or len(value) == length)
            and all(_is_number(v) and each(v) for v in value)
            and (not ordered or list(value) == sorted(value))
        )
        return None if ok else expected

    return check


def in_half_open_unit_interval(value) -> str | None:
    return None if 0 < value <= 1 else "a number in (0, 1]"


@dataclass
class ViTConfig(CheckedConfig):
    """The ViT trainer (``mmpos train vit``): a timm ViT (or an open_clip tower) converted to an mmpos encoding,
    trained with timm's data, optimizer and schedule factories into the run folder ``out`` (``config.yaml``,
    ``log.csv``, ``checkpoint-<step>/``, ``model.safetensors``, ``results.json``). Names that need timm or torch
    (``model``, ``opt``, ``pe``, the ``pe_options`` keys) are checked when the run starts, before ``out`` is made."""

    out: str = option(
        "outputs/vit",
        "run folder (one every node sees)",
        flag="--out",
        aliases=("--output-dir",),
        resume_may_change=True,
    )
    # model
    model: str = option("vit_small_patch16_224", "timm ViT name (vit_*, deit*, eva*, naflexvit*), hf-hub:, open_clip:")
    pretrained: bool | str = option(False, "timm's pretrained weights (an open_clip:NAME model: a pretrained tag)")
    model_kwargs: dict = option({}, "timm.create_model arguments, YAML (img_size, patch_size, depth, ...)")
    num_classes: int | None = option(None, "classes (none: the training set's)", check=positive)
    pe: str | None = option(None, "mmpos encoding (mmpos.list_pes(); none: the model's own positions)")
    pe_options: dict | None = option({}, "the encoding's options, YAML (theta, seed, extrapolation, ...)")
    ape: str = option(
        "drop",
        "a learned APE: drop it, keep it beside the encoding, or resample it (ape_learned)",
        choices=("drop", "keep", "resample"),
    )
    train_only: str | None = option(None, "comma list of pe, head, norm, cls: every other parameter frozen")
    drop_path: float = option(0.0, "stochastic depth rate", check=in_unit_interval)
    # data (timm's factories)
    data_dir: str | None = option(
        None, "root of train/ and val/ (ImageFolder), or of a tar / wds / hfds dataset", resume_may_change=True
    )
    dataset: str = option("", 'timm dataset name: "" (folder / tar), "wds/...", "hfds/...", "torch/..."')
    train_split: str = option("train", "training split")
    val_split: str = option("val", "evaluation split")
    img_size: int = option(224, "training resolution in pixels", check=positive)
    batch_size: int = option(64, "per process (global batch: this x processes)", check=positive)
    num_workers: int = option(4, "data loader workers", check=non_negative, resume_may_change=True)
    scale: list = option(
        [0.08, 1.0],
        "RandomResizedCrop area range [min, max]",
        check=numbers("[min, max] area fractions with 0 < min <= max <= 1", lambda x: 0 < x <= 1, 2, True),
    )
    ratio: list = option(
        [0.75, 1.3333333333333333],
        "RandomResizedCrop aspect range [min, max]",
        check=numbers("[min, max] aspect ratios with 0 < min <= max", lambda x: x > 0, 2, True),
    )
    hflip: float = option(0.5, "horizontal flip probability", check=in_closed_unit_interval)
    color_jitter: float | None = option(0.4, "colour jitter strength (none: none)", check=non_negative_finite)
    auto_augment: str | None = option(
        "rand-m9-mstd0.5-inc1-mmax9", "timm RandAugment policy (mmax9 keeps Posterize >= 1 bit; none: none)"
    )
    reprob: float = option(0.25, "random erasing probability", check=in_closed_unit_interval)
    interpolation: str = option("bicubic", "resize interpolation", choices=VIT_INTERPOLATIONS)
    crop_pct: float = option(1.0, "evaluation crop (1: the whole image resized)", check=in_half_open_unit_interval)
    mean: list | None = option(
        None, "normalisation mean (none: the model's)", check=numbers("3 finite numbers", lambda x: True, 3)
    )
    std: list | None = option(
        None, "normalisation std (none: the model's)", check=numbers("3 positive numbers", lambda x: x > 0, 3)
    )
    mixup: float = option(0.8, "mixup alpha (0: off)", check=non_negative_finite)
    cutmix: float = option(1.0, "CutMix alpha (0: off)", check=non_negative_finite)
    mixup_prob: float = option(1.0, "probability of mixup or CutMix per batch", check=in_closed_unit_interval)
    smoothing: float = option(0.1, "label smoothing", check=in_unit_interval)
    # optimisation (timm's factories)
    opt: str = option("adamw", "timm optimizer (timm.optim.list_optimizers())")
    lr: float = option(5e-4, "peak learning rate", check=positive_finite)
    weight_decay: float = option(0.05, "weight decay", check=non_negative_finite)
    layer_decay: float | None = option(
        None, "layer-wise lr decay, e.g. 0.65 (none: none)", check=in_half_open_unit_interval
    )
    momentum: float = option(0.9, "momentum of sgd / momentum / nesterov", check=in_unit_interval)
    clip_grad: float | None = option(1.0, "max gradient norm (0 or none: none)", check=non_negative_finite)
    sched: str = option("cosine", "timm per-update schedule", choices=VIT_SCHEDULERS)
    steps: int = option(1000, "optimizer updates", check=positive)
    warmup_steps: int = option(50, "linear warm-up updates", check=non_negative)
    warmup_lr: float = option(1e-6, "learning rate at the start of the warm-up", check=non_negative_finite)
    min_lr: float = option(1e-6, "learning rate at the end of the schedule", check=non_negative_finite)
    grad_accum: int = option(1, "batches accumulated per update", check=positive)
    ema_decay: float | None = option(
        None,
        "EMA decay in [0, 1), e.g. 0.9998: evaluated instead of the model (0 or none: no EMA)",
        check=in_unit_interval,
    )
    # runtime
    mixed_precision: str = option("no", "accelerate mixed precision", choices=("no", "bf16", "fp16"))
    compile: bool = option(False, "torch.compile the model", resume_may_change=True)
    seed: int = option(0, "seed of the weights, the data order, augmentation and dropout", check=non_negative)
    log_every: int = option(20, "updates between log.csv rows", check=positive, resume_may_change=True)
    checkpoint_every: int = option(
        500, "updates between checkpoints (and at the end)", check=positive, resume_may_change=True
    )
    eval_sizes: list | None = option(
        None,
        "evaluation resolutions in pixels, YAML (none: [img_size])",
        check=numbers("a list of positive integers (pixels)", lambda x: isinstance(x, int) and x > 0),
        resume_may_change=True,
    )
    eval_scales: list | None = option(
        None,
        "or multiples of img_size, e.g. [1, 1.5, 2]",
        check=numbers("a list of positive numbers", lambda x: x > 0),
        resume_may_change=True,
    )
    eval_aspects: list = option(
        [1.0],
        "width / height ratios evaluated at every size",
        check=numbers("a list of positive numbers (width / height)", lambda x: x > 0),
        resume_may_change=True,
    )
    eval_extrapolation: list = option(
        ["none"],
        "extrapolations evaluated (mmpos.training.vit_eval)",
        choices=VIT_EXTRAPOLATIONS,
        nargs="+",
        resume_may_change=True,
    )
    eval_batch_size: int | None = option(
        None, "evaluation batch (none: batch_size)", check=positive, resume_may_change=True
    )

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.pretrained, str) and not (self.pretrained and self.model.startswith("open_clip:")):
            raise ConfigError(
                f"pretrained: expected true or false (a tag only for open_clip:NAME models), got {self.pretrained!r}"
            )
        if not self.eval_extrapolation:
            raise ConfigError(f"eval_extrapolation: expected a list of some of {', '.join(VIT_EXTRAPOLATIONS)}")

    def eval_resolutions(self) -> list[int]:
        """Evaluation resolutions in pixels: ``eval_sizes``, else ``eval_scales`` x ``img_size``, else img_size."""
        if self.eval_sizes:
            return [int(s) for s in self.eval_sizes]
        if self.eval_scales:
            return [int(round(float(s) * self.img_size)) for s in self.eval_scales]
        return [self.img_size]
