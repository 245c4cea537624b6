"""YAML run configs: load, apply ``key.sub=value`` overrides, save next to the outputs."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import yaml

from mmpos._atomic import written_atomically

# configs/ beside pipelines/ in a checkout; in a wheel pipelines/ is mmpos/pipelines and configs/ is mmpos/configs
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def default_config_path(name: str) -> Path:
    return CONFIG_DIR / f"{name}.yaml"


def load_config(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config {path} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f) or {}
    except UnicodeDecodeError as error:
        raise ValueError(f"config {path} is not a UTF-8 text file ({error.reason} at byte {error.start})") from None
    except yaml.YAMLError as error:
        raise ValueError(f"config {path} is not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(config, dict):
        raise ValueError(f"config {path} must be a mapping at the top level")
    return config


DERIVED_KEYS = ("pipeline",)  # top-level keys a run adds to the config it saves (so a saved config loads again)


def check_config(config: dict, name: str) -> None:
    """Refuse top-level keys that no shipped config ``<name>*.yaml`` has (a typo would be ignored silently) and
    NaN or inf anywhere (``tau: .nan``); each error names the key."""
    known = set(DERIVED_KEYS)
    for path in sorted(CONFIG_DIR.glob(f"{name}*.yaml")):
        known |= set(load_config(path))
    unknown = sorted(set(config) - known) if known != set(DERIVED_KEYS) else []
    if unknown:
        raise ValueError(
            f"config has unknown top-level key(s) {unknown}; expected keys of configs/{name}.yaml: "
            f"{sorted(known - set(DERIVED_KEYS))}"
        )
    for key, value in _leaves(config):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"config key {key} is {value}; expected a finite number")


def _leaves(node, prefix=""):
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        name = f"{prefix}.{key}" if prefix and not isinstance(key, int) else f"{prefix}[{key}]" if prefix else str(key)
        if isinstance(value, (dict, list)):
            yield from _leaves(value, name)
        else:
            yield name, value


def apply_overrides(config: dict, overrides) -> dict:
    """``["band.strength=0.5", "sampler.num_inference_steps=4"]`` -> a new dict; values parsed as YAML.

    Only existing keys can be set (typos are errors); ``key+=value`` adds a new key.
    """
    config = copy.deepcopy(config)
    for item in overrides or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} must look like key.sub=value")
        add = key.endswith("+")
        parts = key.rstrip("+").split(".")
        node = config
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise KeyError(f"override {item!r}: {part!r} is not a section of the config")
            node = node[part]
        if parts[-1] not in node and not add:
            raise KeyError(
                f"override {item!r}: unknown key {parts[-1]!r}; known: {sorted(node)} (use key+=value to add one)"
            )
        parsed = yaml.safe_load(value)
        if isinstance(node.get(parts[-1]), dict) and not isinstance(parsed, dict):
            raise ValueError(
                f"override {item!r}: {parts[-1]!r} is a section of the config; set its keys "
                f"({parts[-1]}.KEY=VALUE) or give a mapping"
            )
        node[parts[-1]] = parsed
    return config


def save_config(config: dict, path) -> Path:
    path = Path(path)
    with written_atomically(path) as temporary, open(temporary, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path


SAMPLER_INTEGERS = {  # sampler key -> what it counts (each a positive integer when set)
    "num_inference_steps": "denoising steps",
    "height": "pixels",
    "width": "pixels",
    "max_sequence_length": "text tokens",
    "num_images_per_prompt": "images",
}
SAMPLER_NUMBERS = ("guidance_scale", "true_cfg_scale")
SAMPLER_OPTIONS = {"height": "--height", "width": "--width"}  # the options of `mmpos generate` that set them


def sampler_value_name(key: str, value) -> str:
    """``("height", 7)`` -> ``--height 7 (sampler.height)``: the option that sets the key and the key; a key no
    option sets: ``sampler.steps=0``."""
    option = SAMPLER_OPTIONS.get(key)
    return f"{option} {value!r} (sampler.{key})" if option else f"sampler.{key}={value!r}"


def check_sampler(config: dict) -> None:
    """The config's ``sampler`` section: counts are positive integers, scales are numbers (``--set
    sampler.num_inference_steps=0`` would divide by zero inside diffusers); a ValueError names the key."""
    sampler = config.get("sampler") or {}
    if not isinstance(sampler, dict):
        raise ValueError(f"config sampler={sampler!r}: expected a mapping of pipeline call arguments")
    for key, counts in SAMPLER_INTEGERS.items():
        value = sampler.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{sampler_value_name(key, value)}: expected a positive integer ({counts})")
    for key in SAMPLER_NUMBERS:
        value = sampler.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"sampler.{key}={value!r}: expected a number")
