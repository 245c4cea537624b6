"""The world image trainer's config as a dataclass (the training scaffold's config style), made from
:data:`DEFAULTS` so that a key added there is a field here: each value checked against its field's type
and rule, an unknown key refused by name, ``--set`` values parsed as YAML (:mod:`mmpos.training.scaffold.config`).

    config = load_world_config("configs/world/t2i.yaml", ["lr=1e-3"], {"max_steps": 10})   # a checked dict
"""

from __future__ import annotations

import dataclasses

from ...models.world.image import TASKS
from ..scaffold.config import ConfigError, check_value, finite, non_negative, positive, read_config_file, yaml_value

ALL_TASKS = ("vae",) + TASKS
DEFAULTS = {
    "task": "t2i",
    "image_size": 64,
    "num_examples": 20000,
    "data_seed": 0,
    "workers": 1,
    "batch_size": 64,
    "lr": 3e-4,
    "weight_decay": 0.0,
    "warmup_steps": 100,
    "ema_decay": 0.999,
    "max_steps": 100000,
    "max_minutes": 10.0,
    "mixed_precision": "no",
    "seed": 0,
    "log_every": 50,
    "checkpoint_every": 1000,
    "caption_dropout": 0.1,
    "style_dropout": 0.25,
    "kl_weight": 1e-6,
    "sample_steps": 20,
    "sample_guidance": 3.0,
    "num_samples": 8,
    "vae_path": None,
    "init_from": None,
    "transformer": {},
    "text_encoder": {},
    "vae": {},
    "architecture": "flux",
}
# what a resumed run may change (the rest defines the model, the data or the run's draws)
RESUME_MAY_CHANGE = {
    "max_steps",
    "max_minutes",
    "log_every",
    "checkpoint_every",
    "workers",
    "sample_steps",
    "sample_guidance",
    "num_samples",
    "device",
    "vae_path",
}


def _unit(value) -> str | None:
    return None if 0 <= value <= 1 else "a number in [0, 1]"


def _decay(value) -> str | None:
    return None if 0 <= value < 1 else "a number in [0, 1)"


def _positive_finite(value) -> str | None:
    return finite(value) or positive(value)


RULES = {
    "image_size": positive,
    "num_examples": positive,
    "workers": positive,
    "batch_size": positive,
    "lr": _positive_finite,
    "weight_decay": non_negative,
    "warmup_steps": non_negative,
    "ema_decay": _decay,
    "max_steps": positive,
    "max_minutes": positive,
    "log_every": positive,
    "checkpoint_every": positive,
    "caption_dropout": _unit,
    "style_dropout": _unit,
    "kl_weight": non_negative,
    "sample_steps": non_negative,
    "sample_guidance": finite,
    "num_samples": positive,
}
CHOICES = {"task": ALL_TASKS, "mixed_precision": ("no", "bf16", "fp16"), "device": ("cpu", "cuda")}


def _field(name: str, default):
    """A field typed by its default (``None``: an optional string)."""
    kind = type(default) if default is not None else str | None
    metadata = dict(check=RULES.get(name), choices=CHOICES.get(name), help="")
    if isinstance(default, dict):
        return name, kind, dataclasses.field(default_factory=dict, metadata=metadata)
    return name, kind, dataclasses.field(default=default, metadata=metadata)


WorldImageConfig = dataclasses.make_dataclass(
    "WorldImageConfig", [_field(k, v) for k, v in {**DEFAULTS, "device": None}.items()]
)
WorldImageConfig.__doc__ = "The world image trainer's keys (:data:`DEFAULTS`, plus ``device``)."


def _checked(key: str, value):
    check_value(WorldImageConfig, key, value)  # refuses an unknown key, a wrong type or a value out of range
    return value  # kept as given (an int stays an int in the exported train_config.yaml)


def load_world_config(path=None, sets=(), flags: dict | None = None) -> dict:
    """The config: ``path``'s keys, then the flags (``None`` values skipped), then ``KEY=VALUE`` items (YAML).
    Raises :class:`~mmpos.training.scaffold.config.ConfigError` naming the key (and the file)."""
    config = read_config_file(WorldImageConfig, path) if path is not None else {}
    config = {key: _checked(key, value) for key, value in _as_given(path, config).items()}
    for key, value in (flags or {}).items():
        if value is not None:
            config[key] = _checked(key, value)
    for item in sets:
        key, equals, text = item.partition("=")
        if not equals:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        key = key.strip()
        config[key] = _checked(key, yaml_value(text) if key not in ("task", "mixed_precision", "device") else text)
    return config


def _as_given(path, checked: dict) -> dict:
    """The file's values as written (``read_config_file`` turns ints of float fields into floats)."""
    if path is None:
        return checked
    from pathlib import Path

    import yaml

    from ..scaffold.config import Yaml12Loader

    raw = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=Yaml12Loader) or {}  # noqa: S506 - a SafeLoader
    return {key: raw[key] for key in checked}
