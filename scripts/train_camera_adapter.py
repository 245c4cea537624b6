"""Train a camera adapter (ucpe | prope | plucker) on a frozen Wan transformer with flow matching.

    accelerate launch scripts/train_camera_adapter.py --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --data DATA \\
        --kind ucpe --out runs/ucpe --steps 20000 --batch-size 1 --frames 49 --height 480 --width 832 \\
        --bf16 --gradient-checkpointing
    python scripts/train_camera_adapter.py --data DATA --out runs/tiny --steps 4     # tiny offline Wan, CPU

Only the adapter's parameters train (mmpos.training.tasks.camera_adapter). The run is the training scaffold's
(mmpos.training.scaffold, docs/scaling.md): ``OUT/checkpoint-<step>/`` (safetensors and JSON, no pickle, plus
``adapter/`` for ``CameraAdapter.from_pretrained``), ``log.jsonl``; ``--resume`` continues from the latest
checkpoint, bit-identical to an uninterrupted run; --batch-size is per process. Any key can also come from
``--config FILE.yaml`` or ``--set key=value``.
"""

from __future__ import annotations

import sys

from mmpos.training.scaffold.config import parse_run

PROG = "train_camera_adapter"


def train(argv=None) -> dict | None:
    """Train; returns ``{update: loss}`` (the mean over processes) of the updates this run made, None when a
    non-finite loss or a failed checkpoint write stopped it (said on stderr)."""
    from mmpos.training.task_configs import CameraAdapterConfig

    config, args = parse_run(CameraAdapterConfig, PROG, __doc__, (), argv)  # before torch loads
    from mmpos.training.scaffold.loop import train_command
    from mmpos.training.tasks.camera_adapter import CameraAdapterTask

    result = train_command(PROG, CameraAdapterTask(config), args.resume, args.overwrite)
    return None if result is None else result.losses


def main(argv=None) -> int:
    losses = train(argv)
    if losses is None:
        return 1
    if losses:
        last = max(losses)
        print(f"trained to step {last}: loss {losses[last]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
