"""Train a model of the mmpos mini-world: the VAE first, then t2i / fill / kontext on its latents:
``mmpos train world_image`` (the same options; this script is kept for the commands in the docs).

    python scripts/train_world.py --config configs/world/vae.yaml --out outputs/world
    python scripts/train_world.py --config configs/world/t2i.yaml --out outputs/world --vae outputs/world
    python scripts/train_world.py --config configs/world/t2i.yaml --out outputs/world --resume  # continue

Writes ``<out>/world-<task>/`` (save_pretrained weights, model card, sample grid, the config used) and
``<out>/train-<task>/checkpoint-<step>/`` (the training scaffold's checkpoints, for --resume; not shipped; an
earlier ``<out>/train_state-<task>/`` resumes too). On N processes (``torchrun --nproc_per_node N``) ``batch_size``
is per process and only the main process writes. Every key (:class:`mmpos.training.task_configs.WorldImageConfig`)
comes from ``--config FILE.yaml``, its flag or ``--set key=value``, checked against its type and rule.
"""

from __future__ import annotations

from mmpos.training.scaffold.config import build_parser, parse_config
from mmpos.training.task_configs import WorldImageConfig

PROG = "train_world.py"


def main(argv=None) -> int:
    config, args = parse_config(WorldImageConfig, build_parser(WorldImageConfig, PROG, __doc__), argv)  # torch-free
    from mmpos.training.tasks import run_own_loop

    return run_own_loop("world_image", config, args.resume, args.overwrite, PROG)


if __name__ == "__main__":
    raise SystemExit(main())
