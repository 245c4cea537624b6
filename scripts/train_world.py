#!/usr/bin/env python
"""Train a model of the mmpos mini-world: the VAE first, then t2i / fill / kontext on its latents.

    python scripts/train_world.py --config configs/world/vae.yaml --out outputs/world
    python scripts/train_world.py --config configs/world/t2i.yaml --out outputs/world --vae outputs/world
    python scripts/train_world.py --config configs/world/t2i.yaml --out outputs/world --resume  # continue

Writes ``<out>/world-<task>/`` (save_pretrained weights, model card, sample grid, the config used) and
``<out>/train-<task>/checkpoint-<step>/`` (the training scaffold's checkpoints, for --resume; not shipped; an
earlier ``<out>/train_state-<task>/`` resumes too). On N processes (``torchrun --nproc_per_node N``) ``batch_size``
is per process and only the main process writes.
Accelerate settings (mixed precision, device) come from the config or the flags below.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mmpos._validation import NonFiniteLossError, OneLineErrorParser, positive_int_arg


def main(argv=None) -> int:
    parser = OneLineErrorParser(prog="train_world.py", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML config (see configs/world/)")
    parser.add_argument("--out", required=True, help="output folder (holds world-vae/ and world-<task>/)")
    parser.add_argument("--vae", help="folder with the trained world-vae (required for t2i/fill/kontext)")
    parser.add_argument("--max-steps", type=positive_int_arg, help="stop after this many optimiser steps")
    parser.add_argument("--max-minutes", type=float, help="stop after this many minutes of training")
    parser.add_argument("--mixed-precision", choices=("no", "bf16", "fp16"), help="accelerate mixed precision")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="force the device (default: accelerate's)")
    parser.add_argument("--resume", action="store_true", help="continue from <out>/train-<task>/checkpoint-<step>")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier run of the task in --out (its "
        "state and export are replaced once the new ones are complete)",
    )
    parser.add_argument("--quiet", action="store_true", help="print losses as lines instead of a progress bar")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config entries")
    args = parser.parse_args(argv)

    from mmpos.training.scaffold.config import ConfigError
    from mmpos.training.scaffold.folders import UnreadableCheckpointError
    from mmpos.training.tasks.world_image import DEFAULTS, check_earlier_run, check_writable_folder, train
    from mmpos.training.world.config import load_world_config

    config_path = Path(args.config)
    if not config_path.is_file():
        parser.error(f"--config {config_path} does not exist")
    flags = {
        "max_steps": args.max_steps,
        "max_minutes": args.max_minutes,
        "mixed_precision": args.mixed_precision,
        "device": args.device,
        "vae_path": args.vae,
    }
    try:  # every key checked against its type and rule (mmpos.training.world.config), an unknown one refused
        config = load_world_config(config_path, args.set, flags)
    except ConfigError as error:
        parser.error(str(error))
    try:
        check_writable_folder(args.out)
        check_earlier_run(args.out, config.get("task", DEFAULTS["task"]), args.resume, args.overwrite)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    try:
        card = train(config, args.out, resume=args.resume, progress=not args.quiet, overwrite=args.overwrite)
    except (ConfigError, FileNotFoundError, UnreadableCheckpointError) as error:  # --resume: a changed key that
        parser.error(str(error))  # defines the run, nothing to resume, a checkpoint that cannot be read
    except NonFiniteLossError as error:
        print(f"train_world.py: error: {error}", file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", "0")) != 0:  # on N processes the main one reports
        return 0
    summary = {
        k: card.get(k)
        for k in (
            "task",
            "steps",
            "train_minutes",
            "final_train_loss",
            "val_loss_start",
            "val_loss",
            "val_l1_start",
            "val_l1",
            "parameters",
        )
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
