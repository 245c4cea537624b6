"""Fine-tune a timm ViT with an mmpos positional encoding (accelerate; CPU, GPU, ``accelerate launch``).

    python scripts/train_vit.py --config configs/vit/world_relation.yaml --pe rope_mixed --output-dir runs/rm
    accelerate launch scripts/train_vit.py --config configs/vit/imagenet_b16_rope_mixed.yaml --output-dir runs/b16
    python scripts/train_vit.py --config ... --output-dir runs/rm --resume        # continue
    python scripts/train_vit.py --config ... --output-dir runs/rm --eval-only     # evaluate the newest checkpoint

The logic lives in :mod:`mmpos.training` (also ``mmpos train vit``).
"""

import sys

from mmpos.training.vit_cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
