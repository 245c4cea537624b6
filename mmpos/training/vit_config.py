"""Configuration of the ViT trainer: defaults, YAML files and ``--set key=value`` overrides.

A config is a flat mapping; every key is listed in :data:`DEFAULTS` (an unknown key is an error naming it).
Values given with ``--set`` are parsed as YAML (``--set lr=1e-3``, ``--set eval_sizes=[32,48]``,
``--set model_kwargs={depth: 4}``); ``1e-3`` is a number, as in YAML 1.2 (PyYAML's YAML 1.1 reads it as a string).
Every value is checked against :data:`RULES` (type and range) before anything is built: a wrong one is a
:class:`ConfigError` naming the key and what was expected.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from .scaffold.config import ConfigError, Yaml12Loader

DEFAULTS: dict = {
    # model
    "model": "vit_small_patch16_224",  # any timm ViT name (vit_*, deit*, eva*, naflexvit*)
    "pretrained": False,  # timm's normal weight loading (hub / cache)
    "model_kwargs": {},  # passed to timm.create_model (img_size, patch_size, depth, ...)
    "num_classes": None,  # default: number of classes of the training set
    "pe": None,  # mmpos encoding name; None keeps the model's own positions
    "pe_options": {},  # the encoding's options (theta, seed, extrapolation, ...)
    "ape": "drop",  # warm start of a learned APE: drop | keep | resample (docs/vit_training.md)
    "train_only": None,  # e.g. "pe,head": every other parameter frozen
    "drop_path": 0.0,
    # data (timm factories)
    "data_dir": None,  # root of train/ and val/ (ImageFolder), or of a tar / wds / hfds dataset
    "dataset": "",  # timm dataset name: "" (folder/tar), "wds/...", "hfds/...", "torch/..."
    "train_split": "train",
    "val_split": "val",
    "img_size": 224,
    "batch_size": 64,  # per process
    "num_workers": 4,
    "scale": [0.08, 1.0],  # RandomResizedCrop area range
    "ratio": [0.75, 1.3333333333333333],
    "hflip": 0.5,
    "color_jitter": 0.4,
    # RandAugment (timm's ImageNet recipe; mmax9 keeps Posterize >= 1 bit, Pillow >= 11 refuses 0); None: none
    "auto_augment": "rand-m9-mstd0.5-inc1-mmax9",
    "reprob": 0.25,  # random erasing probability
    "interpolation": "bicubic",
    "crop_pct": 1.0,  # evaluation crop (1.0: whole image resized)
    "mean": None,  # default: the model's pretrained config
    "std": None,
    "mixup": 0.8,
    "cutmix": 1.0,
    "mixup_prob": 1.0,
    "smoothing": 0.1,
    # optimisation (timm factories)
    "opt": "adamw",
    "lr": 5e-4,
    "weight_decay": 0.05,
    "layer_decay": None,  # layer-wise lr decay, e.g. 0.65
    "momentum": 0.9,
    "clip_grad": 1.0,  # max grad norm; None for none
    "sched": "cosine",
    "steps": 1000,  # optimizer updates
    "warmup_steps": 50,
    "warmup_lr": 1e-6,
    "min_lr": 1e-6,
    "grad_accum": 1,
    "ema_decay": None,  # e.g. 0.9998: ModelEmaV3, evaluated instead of the model
    # runtime
    "mixed_precision": "no",  # no | bf16 | fp16 (accelerate)
    "compile": False,  # torch.compile the model
    "seed": 0,
    "log_every": 20,
    "checkpoint_every": 500,  # optimizer updates between checkpoints (and at the end)
    "eval_sizes": None,  # evaluation resolutions (pixels); default [img_size]
    "eval_scales": None,  # or multiples of img_size, e.g. [1, 1.5, 2]
    "eval_aspects": [1.0],  # width / height ratios evaluated at every size
    "eval_extrapolation": ["none"],  # none | pi | ntk | yarn (see mmpos.training.vit_eval)
    "eval_batch_size": None,  # default: batch_size
}


SCHEDULERS = ("cosine", "tanh", "step", "multistep", "constant", "poly")  # timm's per-update schedules
CHOICES = {
    "ape": ("drop", "keep", "resample"),
    "mixed_precision": ("no", "bf16", "fp16"),
    "sched": SCHEDULERS,
    "interpolation": ("bicubic", "bilinear", "nearest", "box", "hamming", "lanczos", "random"),
}
EXTRAPOLATIONS = ("none", "pi", "ntk", "yarn")
# keys a resumed run may change (they change neither the model nor the updates); every other key is refused
RESUMABLE_KEYS = (
    "num_workers",
    "log_every",
    "checkpoint_every",
    "compile",
    "data_dir",
    "eval_sizes",
    "eval_scales",
    "eval_aspects",
    "eval_extrapolation",
    "eval_batch_size",
)


def parse_yaml(text: str, where: str):
    """``text`` parsed as YAML (safe: no ``!!python`` tags), or a one-line :class:`ConfigError` naming ``where``."""
    try:
        return yaml.load(text, Loader=Yaml12Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or " ".join(str(error).split())
        raise ConfigError(f"{where}: not valid YAML{at}: {problem}") from None


def read_config_file(path) -> dict:
    """The mapping in the YAML file ``path`` (UTF-8), or a :class:`ConfigError` naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"--config {path}: not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    except OSError as error:
        raise ConfigError(f"--config {path}: cannot be read ({error.strerror or error})") from None
    loaded = parse_yaml(text, f"--config {path}") or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"--config {path}: expected a mapping of keys to values")
    return loaded


def parse_override(text: str) -> tuple[str, object]:
    """``"key=value"`` -> ``(key, yaml-parsed value)``."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), parse_yaml(value, f"--set {text}")


def check_keys(config: dict, where: str) -> None:
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown config key(s) {unknown} in {where}; known keys: {sorted(DEFAULTS)}")


def load_config(path=None, overrides=(), **explicit) -> dict:
    """Defaults <- YAML file ``path`` <- ``overrides`` (``key=value`` strings) <- ``explicit`` (not None)."""
    config = dict(DEFAULTS)
    if path is not None:
        loaded = read_config_file(path)
        check_keys(loaded, f"--config {path}")
        config.update(loaded)
    for text in overrides:
        key, value = parse_override(text)
        check_keys({key: value}, f"--set {text}")
        config[key] = value
    extra = {k: v for k, v in explicit.items() if v is not None}
    check_keys(extra, "arguments")
    config.update(extra)
    check_config(config)
    return config


def check_config(config: dict) -> None:
    """Every value of a complete config of the right type and in range (:data:`RULES`), the names known; else a
    :class:`ConfigError` naming the first wrong key and what was expected."""
    check_keys(config, "config")
    missing = sorted(set(DEFAULTS) - set(config))
    if missing:
        raise ConfigError(f"config: missing key(s) {missing}")
    for key, (expected, ok) in RULES.items():
        if not _holds(ok, config[key]):
            raise ConfigError(f"config {key}={config[key]!r}: expected {expected}")
    for key, choices in CHOICES.items():
        if config[key] not in choices:
            raise ConfigError(f"config {key}={config[key]!r}: expected one of {list(choices)}")
    if config["pe"] is not None:
        from mmpos import list_pes

        if config["pe"] not in list_pes():
            raise ConfigError(f"config pe={config['pe']!r}: expected one of mmpos.list_pes() {list_pes()}")
    check_pe_options(config)
    check_model_name(config["model"])
    if isinstance(config["pretrained"], str) and not str(config["model"]).startswith("open_clip:"):
        raise ConfigError(
            f"config pretrained={config['pretrained']!r}: expected true or false (a tag only for open_clip:NAME models)"
        )
    _check_optimizer_name(config["opt"])


CONVERT_OPTIONS = ("share_pe", "grid_mode", "grid_scale", "grid_indexing")  # mmpos.integrations.timm.convert's own


def check_pe_options(config: dict) -> None:
    """Every key of ``pe_options`` is an option of the encoding (``pe``; ``ape: resample``: ape_learned) or of the
    timm conversion; a ConfigError names the unknown key and the valid ones (else a TypeError deep in the build)."""
    from mmpos.encodings import pe_options

    pe = "ape_learned" if config["ape"] == "resample" and config["pe"] is None else config["pe"]
    if pe is None or not config["pe_options"] or str(config["model"]).startswith("open_clip:"):
        return
    supplied = ("head_dim", "num_heads", "num_prefix_tokens", "num_axes", "embed_dim", "grid_size")  # by the model
    valid = sorted(set(pe_options(pe)) - set(supplied) | set(CONVERT_OPTIONS))
    unknown = sorted(set(config["pe_options"]) - set(valid))
    if unknown:
        raise ConfigError(f"config pe_options: unknown key(s) {unknown} for pe={pe!r}; valid keys: {valid}")


def _holds(ok, value) -> bool:
    try:
        return bool(ok(value))
    except (TypeError, ValueError):
        return False


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _numbers(value, ok, length=None) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and (length is None or len(value) == length)
        and all(_number(v) and ok(v) for v in value)
    )


def _optional(ok):
    return lambda v: v is None or ok(v)


_POSITIVE_INT = ("a positive integer", lambda v: _int(v) and v >= 1)
_NON_NEGATIVE = ("a finite number >= 0", lambda v: _number(v) and v >= 0)
_PROBABILITY = ("a number in [0, 1]", lambda v: _number(v) and 0 <= v <= 1)
_BOOL = ("true or false", lambda v: isinstance(v, bool))


def _bool_or_text(value) -> bool:
    return isinstance(value, bool) or (isinstance(value, str) and bool(value))


_TEXT = ("a string", lambda v: isinstance(v, str))
_OPTIONAL_TEXT = ("a string or null", _optional(lambda v: isinstance(v, str)))

RULES: dict = {
    "model_kwargs": ("a mapping of timm.create_model arguments", lambda v: isinstance(v, dict)),
    "pe_options": ("a mapping of the encoding's options (or null)", _optional(lambda v: isinstance(v, dict))),
    "pretrained": ("true or false (an open_clip model: false or a pretrained tag, e.g. openai)", _bool_or_text),
    "compile": _BOOL,
    "num_classes": ("a positive integer or null (the training set's)", _optional(_POSITIVE_INT[1])),
    "pe": _OPTIONAL_TEXT,
    "train_only": _OPTIONAL_TEXT,
    "data_dir": _OPTIONAL_TEXT,
    "auto_augment": _OPTIONAL_TEXT,
    "dataset": _TEXT,
    "train_split": _TEXT,
    "val_split": _TEXT,
    "opt": _TEXT,
    "model": _TEXT,
    "drop_path": ("a number in [0, 1)", lambda v: _number(v) and 0 <= v < 1),
    "img_size": _POSITIVE_INT,
    "batch_size": _POSITIVE_INT,
    "steps": _POSITIVE_INT,
    "grad_accum": _POSITIVE_INT,
    "log_every": _POSITIVE_INT,
    "checkpoint_every": _POSITIVE_INT,
    "num_workers": ("an integer >= 0", lambda v: _int(v) and v >= 0),
    "warmup_steps": ("an integer >= 0", lambda v: _int(v) and v >= 0),
    "seed": ("an integer >= 0", lambda v: _int(v) and v >= 0),
    "eval_batch_size": ("a positive integer or null (batch_size)", _optional(_POSITIVE_INT[1])),
    "scale": (
        "[min, max] area fractions with 0 < min <= max <= 1",
        lambda v: _numbers(v, lambda x: 0 < x <= 1, 2) and v[0] <= v[1],
    ),
    "ratio": (
        "[min, max] aspect ratios with 0 < min <= max",
        lambda v: _numbers(v, lambda x: x > 0, 2) and v[0] <= v[1],
    ),
    "hflip": _PROBABILITY,
    "reprob": _PROBABILITY,
    "mixup_prob": _PROBABILITY,
    "smoothing": ("a number in [0, 1)", lambda v: _number(v) and 0 <= v < 1),
    "color_jitter": ("a finite number >= 0 or null", _optional(_NON_NEGATIVE[1])),
    "mixup": _NON_NEGATIVE,
    "cutmix": _NON_NEGATIVE,
    "crop_pct": ("a number in (0, 1]", lambda v: _number(v) and 0 < v <= 1),
    "mean": ("null or 3 finite numbers", _optional(lambda v: _numbers(v, lambda x: True, 3))),
    "std": ("null or 3 positive numbers", _optional(lambda v: _numbers(v, lambda x: x > 0, 3))),
    "lr": ("a positive finite number", lambda v: _number(v) and v > 0),
    "warmup_lr": _NON_NEGATIVE,
    "min_lr": _NON_NEGATIVE,
    "weight_decay": _NON_NEGATIVE,
    "layer_decay": ("a number in (0, 1] or null", _optional(lambda v: _number(v) and 0 < v <= 1)),
    "momentum": ("a number in [0, 1)", lambda v: _number(v) and 0 <= v < 1),
    "clip_grad": ("a finite number >= 0 (max grad norm; 0 or null: none)", _optional(_NON_NEGATIVE[1])),
    "ema_decay": ("a number in [0, 1) or null (0 or null: no EMA)", _optional(lambda v: _number(v) and 0 <= v < 1)),
    "eval_sizes": (
        "null or a list of positive integers (pixels)",
        _optional(lambda v: _numbers(v, lambda x: _int(x) and x > 0)),
    ),
    "eval_scales": ("null or a list of positive numbers", _optional(lambda v: _numbers(v, lambda x: x > 0))),
    "eval_aspects": ("a list of positive numbers (width / height)", lambda v: _numbers(v, lambda x: x > 0)),
    "eval_extrapolation": (
        f"a list of some of {list(EXTRAPOLATIONS)}",
        lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(k in EXTRAPOLATIONS for k in v),
    ),
}


def _check_optimizer_name(name: str) -> None:
    from timm.optim import list_optimizers

    known = list_optimizers()
    if name.lower() not in known and name.lower().split("_")[-1] not in known:
        raise ConfigError(
            f"config opt={name!r}: expected a timm optimizer name (timm.optim.list_optimizers(): "
            f"{', '.join(known[:12])}, ...)"
        )


def check_resume_config(config: dict, saved_path) -> None:
    """A resumed run keeps the config it was started with: any key outside :data:`RESUMABLE_KEYS` that differs from
    ``saved_path`` (the run's ``config.yaml``) raises a :class:`ConfigError` naming the keys."""
    saved = load_config(saved_path) if Path(saved_path).is_file() else None
    if saved is None:
        return
    changed = sorted(k for k in DEFAULTS if k not in RESUMABLE_KEYS and _plain(saved[k]) != _plain(config[k]))
    if changed:
        details = ", ".join(f"{k}: {saved[k]!r} -> {config[k]!r}" for k in changed)
        raise ConfigError(
            f"--resume: the run in {Path(saved_path).parent} was started with another config "
            f"({details}); resume it with its own config.yaml (keys allowed to change: "
            f"{', '.join(RESUMABLE_KEYS)}) or start a new --output-dir"
        )


def _plain(value):
    """Lists for tuples, recursively (a config read back from YAML holds lists)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def check_model_name(name) -> None:
    """A timm model name, ``SOURCE:NAME`` (``hf-hub:``, ``local-dir:``, ``open_clip:``; resolved when built), or a
    :class:`ConfigError` here, before the run folder is made."""
    import timm

    if isinstance(name, str) and (":" in name or timm.is_model(name)):
        return
    raise ConfigError(
        f"config model={name!r}: expected a timm model name (timm.list_models()), 'hf-hub:REPO' or 'open_clip:NAME'"
    )


def eval_sizes(config: dict) -> list[int]:
    """Evaluation resolutions in pixels: ``eval_sizes``, else ``eval_scales`` x ``img_size``, else img_size."""
    if config["eval_sizes"]:
        return [int(s) for s in config["eval_sizes"]]
    if config["eval_scales"]:
        return [int(round(float(s) * config["img_size"])) for s in config["eval_scales"]]
    return [config["img_size"]]
