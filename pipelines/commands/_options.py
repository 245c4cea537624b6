"""Options shared by the config-driven run commands (``mmpos edit ...``, ``mmpos generate [image]``) and the
old ``--box L,T,R,B`` spelling. Light: nothing here imports torch or diffusers."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mmpos._atomic import ConcurrentWriteError, claim_output


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
        "pooled_prompt_embeds [B, D] or (Qwen-Image, optional) prompt_embeds_mask [B, L] (Chroma: "
        "prompt_attention_mask) "
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


def output_folder(args, default: Path) -> Path:
    """Where a run writes: a named ``--out`` that holds files is refused (one line, exit 2) unless ``--overwrite``;
    without ``--out``, ``default`` or the next free ``default-2``, ``default-3``, ... (never an earlier run)."""
    if not args.out:
        return fresh_folder(default)
    out = Path(args.out)
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))  # the nearest folder that exists
    if out.exists() and not out.is_dir():
        message = f"--out {out} is a file; expected a folder"
    elif out.is_dir() and any(out.iterdir()) and not getattr(args, "overwrite", False):
        message = f"--out {out} already holds files; choose another folder or pass --overwrite"
    elif not existing.is_dir():
        message = f"--out {out} cannot be created: {existing} is a file"
    elif not os.access(existing, os.W_OK | os.X_OK):
        message = f"--out {out} cannot be created: {existing} is not writable"
    else:
        return out
    print(f"mmpos {args.command}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def fresh_folder(default: Path) -> Path:
    """``default`` if absent or empty, else ``default-2``, ``default-3``, ...: an unnamed output never overwrites
    an earlier run, nor one another process writes now (claimed for the command, :func:`~mmpos._atomic.claim_output`)."""
    candidate, index = default, 1
    while True:
        if not (candidate.exists() and any(candidate.iterdir())):
            try:
                return claim_output(candidate)  # another mmpos choosing the same free folder now: the next one
            except ConcurrentWriteError:
                pass
        index += 1
        candidate = default.with_name(f"{default.name}-{index}")


def report_written(paths, out: Path) -> None:
    """Print every file a command wrote (names inside ``out``)."""
    print(f"wrote {len(paths)} files to {out.resolve()}:", *(Path(p).name for p in paths), sep="\n  ")
