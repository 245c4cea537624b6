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
