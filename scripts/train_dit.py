"""Train the reference DiT (mmpos.models.DiT) with any mmpos encoding, on pixels or VAE latents.

Quick CPU check (a tiny model, procedural shapes, three steps):
    python scripts/train_dit.py --tiny --data shapes --steps 3 --output-dir outputs/dit_tiny
A real run (ImageNet-style folder, SD VAE latents, bf16, 4 GPUs; --batch-size is per process):
    accelerate launch --num_processes 4 scripts/train_dit.py --model DiT-B/2 --pe rope_mixed \\
        --data folder --data-dir /data/imagenet/train --vae stabilityai/sd-vae-ft-ema --resolution 256 \\
        --batch-size 64 --steps 400000 --mixed-precision bf16 --objective flow --output-dir outputs/dit_b2_mixed
Resume with the same command plus ``--resume`` (the latest checkpoint) or ``--resume OUT/checkpoint-<step>``.
Any key can also come from ``--config FILE.yaml`` or ``--set key=value``. The run is the training scaffold's
(mmpos.training.scaffold, docs/scaling.md): ``checkpoint-<step>/`` (safetensors and JSON, no pickle), ``log.jsonl``,
then ``model/`` and ``model_ema/`` (``DiT.from_pretrained``) and ``samples.png``. An --output-dir holding an earlier
run is refused without --resume or --overwrite; a NaN or inf loss stops the run (exit code 1) before it reaches the
weights, keeping the last checkpoint.
"""

from __future__ import annotations

from mmpos.training.scaffold.config import parse_run

PROG = "train_dit.py"


def main(argv=None) -> int:
    from mmpos.training.task_configs import DiTConfig
    from mmpos.training.tasks import TASKS

    config, args = parse_run(DiTConfig, PROG, __doc__, TASKS["dit"].outputs, argv)  # before torch loads
    from mmpos.training.scaffold.loop import train_command
    from mmpos.training.tasks.dit import DiTTask

    return 1 if train_command(PROG, DiTTask(config), args.resume, args.overwrite) is None else 0


run = main  # the entry point's earlier name

if __name__ == "__main__":
    raise SystemExit(main())
