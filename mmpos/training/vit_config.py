"""Configuration of the ViT trainer: defaults, YAML files and ``--set key=value`` overrides.

A config is a flat mapping; every key is listed in :data:`DEFAULTS` (an unknown key is an error naming it).
Values given with ``--set`` are parsed as YAML (``--set lr=1e-3``, ``--set eval_sizes=[32,48]``,
``--set model_kwargs={depth: 4}``).
"""
from __future__ import annotations

from pathlib import Path

import yaml

DEFAULTS: dict = {
    # model
    "model": "vit_small_patch16_224",  # any timm ViT name (vit_*, deit*, eva*, naflexvit*)
    "pretrained": False,               # timm's normal weight loading (hub / cache)
    "model_kwargs": {},                # passed to timm.create_model (img_size, patch_size, depth, ...)
    "num_classes": None,               # default: number of classes of the training set
    "pe": None,                        # mmpos encoding name; None keeps the model's own positions
    "pe_options": {},                  # the encoding's options (theta, seed, extrapolation, ...)
    "ape": "drop",                     # warm start of a learned APE: drop | keep | resample (docs/vit_training.md)
    "train_only": None,                # e.g. "pe,head": every other parameter frozen
    "drop_path": 0.0,
    # data (timm factories)
    "data_dir": None,                  # root of train/ and val/ (ImageFolder), or of a tar / wds / hfds dataset
    "dataset": "",                     # timm dataset name: "" (folder/tar), "wds/...", "hfds/...", "torch/..."
    "train_split": "train",
    "val_split": "val",
    "img_size": 224,
    "batch_size": 64,                  # per process
    "num_workers": 4,
    "scale": [0.08, 1.0],              # RandomResizedCrop area range
    "ratio": [0.75, 1.3333333333333333],
    "hflip": 0.5,
    "color_jitter": 0.4,
    # RandAugment (timm's ImageNet recipe; mmax9 keeps Posterize >= 1 bit, Pillow >= 11 refuses 0); None: none
    "auto_augment": "rand-m9-mstd0.5-inc1-mmax9",
    "reprob": 0.25,                    # random erasing probability
    "interpolation": "bicubic",
    "crop_pct": 1.0,                   # evaluation crop (1.0: whole image resized)
    "mean": None,                      # default: the model's pretrained config
    "std": None,
    "mixup": 0.8,
    "cutmix": 1.0,
    "mixup_prob": 1.0,
    "smoothing": 0.1,
    # optimisation (timm factories)
    "opt": "adamw",
    "lr": 5e-4,
    "weight_decay": 0.05,
    "layer_decay": None,               # layer-wise lr decay, e.g. 0.65
    "momentum": 0.9,
    "clip_grad": 1.0,                  # max grad norm; None for none
    "sched": "cosine",
    "steps": 1000,                     # optimizer updates
    "warmup_steps": 50,
    "warmup_lr": 1e-6,
    "min_lr": 1e-6,
    "grad_accum": 1,
    "ema_decay": None,                 # e.g. 0.9998: ModelEmaV3, evaluated instead of the model
    # runtime
    "mixed_precision": "no",           # no | bf16 | fp16 (accelerate)
    "compile": False,                  # torch.compile the model
    "seed": 0,
    "log_every": 20,
    "checkpoint_every": 500,           # optimizer updates between checkpoints (and at the end)
    "eval_sizes": None,                # evaluation resolutions (pixels); default [img_size]
    "eval_scales": None,               # or multiples of img_size, e.g. [1, 1.5, 2]
    "eval_aspects": [1.0],             # width / height ratios evaluated at every size
    "eval_extrapolation": ["none"],    # none | pi | ntk | yarn (see mmpos.training.vit_eval)
    "eval_batch_size": None,           # default: batch_size
}


class ConfigError(ValueError):
    """A config key or value the user gave is wrong (reported as one line, exit code 2, by the command lines)."""


CHOICES = {"ape": ("drop", "keep", "resample"), "mixed_precision": ("no", "bf16", "fp16")}


def parse_override(text: str) -> tuple[str, object]:
    """``"key=value"`` -> ``(key, yaml-parsed value)``."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), yaml.safe_load(value)


def check_keys(config: dict, where: str) -> None:
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown config key(s) {unknown} in {where}; known keys: {sorted(DEFAULTS)}")


def load_config(path=None, overrides=(), **explicit) -> dict:
    """Defaults <- YAML file ``path`` <- ``overrides`` (``key=value`` strings) <- ``explicit`` (not None)."""
    config = dict(DEFAULTS)
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"--config {path}: expected a mapping of keys to values")
        check_keys(loaded, f"--config {path}")
        config.update(loaded)
    for text in overrides:
        key, value = parse_override(text)
        check_keys({key: value}, f"--set {text}")
        config[key] = value
    extra = {k: v for k, v in explicit.items() if v is not None}
    check_keys(extra, "arguments")
    config.update(extra)
    for key, choices in CHOICES.items():
        if config[key] not in choices:
            raise ConfigError(f"config {key}={config[key]!r}: expected one of {list(choices)}")
    if config["pe"] is not None:
        from mmpos import list_pes

        if config["pe"] not in list_pes():
            raise ConfigError(f"config pe={config['pe']!r}: expected one of mmpos.list_pes() {list_pes()}")
    check_model_name(config["model"])
    for key in ("steps", "batch_size", "grad_accum", "img_size"):
        if not isinstance(config[key], int) or config[key] < 1:
            raise ConfigError(f"config {key} must be a positive integer, got {config[key]!r}")
    return config


def check_model_name(name) -> None:
    """A timm model name, ``SOURCE:NAME`` (``hf-hub:``, ``local-dir:``, ``open_clip:``; resolved when built), or a
    :class:`ConfigError` here, before the run folder is made."""
    import timm

    if isinstance(name, str) and (":" in name or timm.is_model(name)):
        return
    raise ConfigError(f"config model={name!r}: expected a timm model name (timm.list_models()), "
                      "'hf-hub:REPO' or 'open_clip:NAME'")


def eval_sizes(config: dict) -> list[int]:
    """Evaluation resolutions in pixels: ``eval_sizes``, else ``eval_scales`` x ``img_size``, else img_size."""
    if config["eval_sizes"]:
        return [int(s) for s in config["eval_sizes"]]
    if config["eval_scales"]:
        return [int(round(float(s) * config["img_size"])) for s in config["eval_scales"]]
    return [config["img_size"]]
