"""Top-1/top-5 of trained ViT runs at several resolutions (JSON + PNG plot of accuracy vs resolution).

    python scripts/eval_vit.py runs/rope_mixed runs/ape_learned --scales 1 1.5 2 --extrapolation none pi ntk \
        --out runs/eval           # writes runs/eval/eval.json and eval.png

The logic lives in :mod:`mmpos.training` (also ``mmpos eval vit``).
"""

import sys

from mmpos.training.vit_eval_cli import eval_main

if __name__ == "__main__":
    sys.exit(eval_main())
