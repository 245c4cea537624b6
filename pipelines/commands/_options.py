"""Options shared by the config-driven run commands (``mmpos edit ...``, ``mmpos generate [image]``) and the
old ``--box L,T,R,B`` spelling. Light: nothing here imports torch or diffusers."""

from __future__ import annotations

import argparse
import sys


def add_run_options(parser: argparse.ArgumentParser, config_name: str, figures: bool = True) -> None:
    """``--config``, ``--model``, ``--prompt-embeds``, ``--device``, ``--dtype``, ``--set``, ``--out``,
    ``--overwrite`` of a run that reads ``configs/<config_name>[_world].yaml``, and ``--no-figures`` where the run
    writes figures (``figures``: ``mmpos edit``; ``mmpos generate`` writes images only)."""
    parser.add_argument(
        "--config",
        help=f"YAML config (default: configs/{config_name}.yaml with CUDA, "
        f"configs/{config_name}_world.yaml without CUDA or with --model world)",
    )
    parser.add_argument("--config-name", default=config_name, help=argparse.SUPPRESS)
    parser.add_argument(
        "--model",
        help="from_pretrained folder or hub id, or 'world' for the shipped world model "
        "(default: the config's model: FLUX.1 with CUDA, the world model without)",
    )
    parser.add_argument(
        "--prompt-embeds",
        help="safetensors/pt file with prompt_embeds [B, L, D] and (Flux) "
        "pooled_prompt_embeds [B, D] or (Qwen-Image, optional) prompt_embeds_mask [B, L] "
        "(for models saved without text encoders; default: encode the prompts)",
    )
    parser.add_argument(
        "--device",
        help="cpu | cuda (default: the config's device: cuda for FLUX.1, falling back "
        "to cpu; cpu for the world models)",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="model dtype (default: the config's dtype: bfloat16 for FLUX.1, float32 for the world models)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set band.strength=0.5, repeat (default: none)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="output folder (default: outputs/<command>, or the next free "
        "outputs/<command>-N); a named folder that holds files is refused unless --overwrite",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="write into a named --out that already holds files (default: refuse)"
    )
    if figures:
        parser.add_argument(
            "--no-figures", action="store_true", help="skip the comparison and diagnostic figures (default: write them)"
        )


def split_comma_box(argv: list[str]) -> list[str]:
    """``--box 8,8,40,40`` (the old syntax) -> ``--box 8 8 40 40``, with a deprecation note."""
    out = []
    for arg in argv:
        value = arg[len("--box=") :] if arg.startswith("--box=") else arg if out[-1:] == ["--box"] else None
        if value is not None and "," in value:
            print(f"note: --box {value} is deprecated; write --box {value.replace(',', ' ')}", file=sys.stderr)
            out += (["--box"] if arg.startswith("--box=") else []) + [v.strip() for v in value.split(",")]
        else:
            out.append(arg)
    return out


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


MAX_SIZE_OVER_TRAINED = 16  # per side: DyPE / YaRN results reach 4-8x the training side; beyond 16x nothing is known


def check_sampler_size(pipe, sampler: dict, prompts: int, train_size) -> None:
    """``sampler.height`` / ``.width``: at most :data:`MAX_SIZE_OVER_TRAINED` times the model's ``train_size``
    (pixels, an int or ``(height, width)``) per side, on ``pipe``'s token grid and within its device's free memory
    for ``prompts`` prompts (:func:`mmpos.pipelines.images.check_output_size`); the ValueError names ``--height`` /
    ``--width``."""
    from ..images import check_output_size

    trained = (train_size, train_size) if isinstance(train_size, int) else tuple(train_size)
    names = [sampler_value_name(key, sampler[key]) for key in ("height", "width")]
    for name, value, side in zip(names, (sampler["height"], sampler["width"]), trained):
        if value > MAX_SIZE_OVER_TRAINED * side:
            raise ValueError(
                f"{name}: {value / side:.0f}x the model's training size {side}; expected at most "
                f"{MAX_SIZE_OVER_TRAINED}x ({MAX_SIZE_OVER_TRAINED * side} pixels)"
            )
    batch = prompts * sampler.get("num_images_per_prompt", 1)
    check_output_size(pipe, sampler["height"], sampler["width"], batch, names)
