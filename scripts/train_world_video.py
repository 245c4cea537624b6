"""Train the world video model's stages on camera-moving clips of the 3D mini-world (CPU-sized defaults):
``mmpos train world_video`` (the same options; this script is kept for the commands in the docs).

    python scripts/train_world_video.py --stage vae  --out runs/video/vae  --max-minutes 10
    python scripts/train_world_video.py --stage base --out runs/video/base --vae runs/video/vae/vae
    python scripts/train_world_video.py --stage ucpe --out runs/video/ucpe --vae runs/video/vae/vae \\
        --base runs/video/base/transformer

Stages, data and checkpoints: :mod:`mmpos.training.tasks.world_video`. ``--resume`` continues a run folder's
newest ``checkpoint-<step>/`` (or a ``state.pt`` of the earlier layout), ``--overwrite`` replaces the run; without
either a folder that has one is refused. ``--max-minutes`` stops (with a checkpoint) after that wall time; rerun
with ``--resume`` to go on. The rendered clips are cached in ``OUT/clips-train.pt``. On N processes
(``torchrun --nproc_per_node N``) ``--batch-size`` is per process and only the main process writes.
"""

from __future__ import annotations

from mmpos.training.scaffold.config import build_parser, parse_config
from mmpos.training.task_configs import WorldVideoConfig

PROG = "train_world_video.py"


def main(argv=None) -> int:
    config, args = parse_config(WorldVideoConfig, build_parser(WorldVideoConfig, PROG, __doc__), argv)  # torch-free
    from mmpos.training.tasks import run_own_loop

    return run_own_loop("world_video", config, args.resume, args.overwrite, PROG)


if __name__ == "__main__":
    raise SystemExit(main())
