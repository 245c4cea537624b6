"""Fine-tune a timm ViT with an mmpos positional encoding (accelerate; CPU, GPU, ``accelerate launch``).

    python scripts/train_vit.py --config configs/vit/world_relation.yaml --pe rope_mixed --out runs/rm
    accelerate launch scripts/train_vit.py --config configs/vit/imagenet_b16_rope_mixed.yaml --out runs/b16
    python scripts/train_vit.py --config ... --out runs/rm --resume        # continue from the newest checkpoint
    python scripts/eval_vit.py runs/rm --out runs/rm_eval                   # evaluate it

Every key of :class:`mmpos.training.ViTConfig` is a flag (``--batch-size 32``), a key of ``--config FILE.yaml`` or a
``--set key=value``. The logic lives in :mod:`mmpos.training` (also ``mmpos train vit``).
"""

from __future__ import annotations

from mmpos.training.scaffold.config import build_parser, parse_config
from mmpos.training.task_configs import ViTConfig

PROG = "train_vit.py"


def main(argv=None) -> int:
    config, args = parse_config(ViTConfig, build_parser(ViTConfig, PROG, __doc__), argv)  # torch-free
    from mmpos.training.tasks import run_own_loop

    return run_own_loop("vit", config, args.resume, args.overwrite, PROG)


if __name__ == "__main__":
    raise SystemExit(main())
