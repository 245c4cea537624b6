"""YAML run configs: load, apply ``key.sub=value`` overrides, save next to the outputs."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import yaml

from mmpos._atomic import written_atomically

# configs/ beside pipelines/ in a checkout; in a wheel pipelines/ is mmpos/pipelines and configs/ is mmpos/configs
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


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


_RUN_FLAG_KEYS = {"model": "model", "device": "device", "dtype": "dtype"}


EDIT_FLAG_KEYS = {**_RUN_FLAG_KEYS, "prompt_text": "prompt"}  # every `mmpos edit METHOD`, then the method's own


# per ``args.method``: option dest -> the (dotted) config key it sets; an option not given keeps the config's value.
# --extrapolate / --train-size set extrapolate.preset / .train_size (:func:`~mmpos.pipelines.extrapolate.extrapolate_setting`).
FLAG_KEYS = {
    "generate": {**_RUN_FLAG_KEYS, "prompt": "prompts", "height": "sampler.height", "width": "sampler.width"},
}


def flag_keys(method: str) -> dict:
    """Option dest -> config key of ``mmpos generate`` or of ``mmpos edit METHOD`` (its EditMethod.flag_keys)."""
    if method in FLAG_KEYS:
        return FLAG_KEYS[method]
    from ..edits import get_edit

    return {**EDIT_FLAG_KEYS, **get_edit(method).flag_keys}


def apply_flags(config: dict, args) -> dict:
    """``config`` with each option of :func:`flag_keys` of ``args.method`` that was given set at its own key
    (sections made as needed), nothing else changed."""
    for dest, key in flag_keys(args.method).items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        *sections, leaf = key.split(".")
        node = config
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return config


def resolve_config(args) -> dict:
    """The command's YAML config <- ``--set`` <- the options that name a config key (:func:`flag_keys`); cuda falls
    back to cpu, saying so. A missing or malformed ``--config`` or a bad ``--set`` ends the command: one line, exit
    code 2."""

    try:
        config = load_config(args.config or default_config_path(default_config_name(args)))
        config = apply_flags(apply_overrides(config, args.set), args)
        check_config(config, args.config_name)
        check_sampler(config)
        check_device(config.get("device"))
    except (FileNotFoundError, KeyError, ValueError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error  # KeyError quotes str()
        print(f"mmpos {args.command}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    if config.get("device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("CUDA is not available: running on cpu (set --device to silence this)")
            config["device"] = "cpu"
    return config


def check_device(device) -> None:
    """``device`` (the config's, or ``--device``) names a torch device (None: the command's default)."""
    if device is None:
        return
    import torch

    try:
        torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device={device!r}: expected a torch device such as cpu, cuda, cuda:1 or mps") from None


def check_prompt_source(args, model) -> None:
    """``--prompt-embeds`` is refused on a world ``model`` (a :class:`~mmpos.pipelines.loading.ModelRef`)."""
    if getattr(args, "prompt_embeds", None) and model.is_world:
        raise ValueError(
            "--prompt-embeds is for FLUX.1 / Qwen-Image pipelines; the world model encodes --prompt "
            "itself (its tokenizer and text encoder are in the model folder)"
        )


def default_config_name(args) -> str:
    """``<command>_world`` (the shipped world models: CPU, float32, 32 px, seconds) with ``--model world``, a world
    model folder, or no ``--model`` on a machine without CUDA (saying so); else the command's FLUX.1 config."""
    from ..loading import is_world_model

    if args.model is None:
        import torch

        if torch.cuda.is_available():
            return args.config_name
        print(
            "no CUDA GPU: running the shipped world models (small Flux-class models, 32 px); pass --model for "
            "another model (e.g. black-forest-labs/FLUX.1-dev)"
        )
        return f"{args.config_name}_world"
    return f"{args.config_name}_world" if is_world_model(args.model) else args.config_name


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


def default_side(pipe) -> int:
    """The height and width in pixels ``pipe`` makes when given none: ``default_sample_size`` latents times
    ``vae_scale_factor`` where it has them, else 1024 (Z-Image's ``__call__`` falls back to 1024 px)."""
    size = getattr(pipe, "default_sample_size", None)
    return 1024 if size is None else size * pipe.vae_scale_factor


def check_sampler_size(pipe, sampler: dict, prompts: int, train_size) -> None:
    """``sampler.height`` / ``.width``: at most :data:`MAX_SIZE_OVER_TRAINED` times the model's ``train_size``
    (pixels, an int or ``(height, width)``) per side, on ``pipe``'s token grid and within its device's free memory
    for ``prompts`` prompts (:func:`mmpos.pipelines.images.check_output_size`); the ValueError names ``--height`` /
    ``--width``."""
    from ..images import MAX_SIZE_OVER_TRAINED, TRAINING, check_output_size, over_trained

    trained = (train_size, train_size) if isinstance(train_size, int) else tuple(train_size)
    default = default_side(pipe)  # a size the config leaves out: the pipeline's
    height, width = (sampler.get(key) or default for key in ("height", "width"))
    names = [sampler_value_name(key, value) for key, value in (("height", height), ("width", width))]
    for name, value, side in zip(names, (height, width), trained):
        if value > MAX_SIZE_OVER_TRAINED * side:
            raise ValueError(f"{name}: {over_trained(value, side, 'size', TRAINING)}")
    batch = prompts * sampler.get("num_images_per_prompt", 1)
    check_output_size(pipe, height, width, batch, names)
