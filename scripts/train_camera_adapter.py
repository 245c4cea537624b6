"""Train a camera adapter (ucpe | prope | plucker) on a frozen Wan transformer with flow matching.

    accelerate launch scripts/train_camera_adapter.py --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --data DATA \\
        --kind ucpe --out runs/ucpe --steps 20000 --batch-size 1 --frames 49 --height 480 --width 832 \\
        --bf16 --gradient-checkpointing
    python scripts/train_camera_adapter.py --data DATA --out runs/tiny --steps 4     # tiny offline Wan, CPU

Only the adapter's parameters train (mmpos.training.camera_adapter_task). The run is the training scaffold's
(mmpos.training.scaffold, docs/scaling.md): ``OUT/checkpoint-<step>/`` (safetensors and JSON, no pickle, plus
``adapter/`` for ``CameraAdapter.from_pretrained``), ``log.jsonl``; ``--resume`` continues from the latest
checkpoint, bit-identical to an uninterrupted run; --batch-size is per process. Any key can also come from
``--config FILE.yaml`` or ``--set key=value``.
"""

from __future__ import annotations

import sys

from mmpos._arguments import user_error
from mmpos.training.scaffold_config import ConfigError, parse_run

PROG = "train_camera_adapter"


def train(argv=None) -> dict:
    """Train; returns ``{update: loss}`` (the mean over processes) of the updates this run made."""
    from mmpos.training.camera_adapter_task import CameraAdapterConfig, CameraAdapterTask
    from mmpos.training.scaffold import train as run_task
    from mmpos.training.scaffold_folders import UnreadableCheckpointError

    config, args = parse_run(CameraAdapterConfig, PROG, __doc__, (), argv)
    try:
        return run_task(CameraAdapterTask(config), args.resume, args.overwrite).losses
    except (UnreadableCheckpointError, ConfigError) as error:
        raise user_error(PROG, error) from None


def main(argv=None) -> int:
    from mmpos.training.scaffold import NonFiniteLossError
    from mmpos.training.scaffold_checkpoint import CheckpointWriteError

    try:
        losses = train(argv)
    except NonFiniteLossError as error:
        print(f"{PROG}: error: NonFiniteLossError: {error}", file=sys.stderr)
        return 1
    except CheckpointWriteError as error:  # a full disk: the earlier checkpoints are intact
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    if losses:
        last = max(losses)
        print(f"trained to step {last}: loss {losses[last]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
