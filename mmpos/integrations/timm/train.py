"""Run timm's own ``train.py`` with the mmpos model names registered.

    python -m mmpos.integrations.timm.train path/to/pytorch-image-models/train.py \
        --model vit_small_patch16_224_mmpos_rope_mixed --model-kwargs pe_theta=10 --pretrained ...

timm's scripts live in its repository, not in the pip package; pass the path of ``train.py`` (or of any
timm script that calls ``timm.create_model``) as the first argument, then its usual arguments.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from . import register_timm_models


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or not argv[0].endswith(".py"):
        print(__doc__)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    script = Path(argv[0])
    if not script.is_file():
        raise SystemExit(f"timm script not found: {script}")
    register_timm_models()  # also picks up encodings registered after mmpos.integrations.timm was imported
    sys.argv = [str(script)] + argv[1:]
    sys.path.insert(0, str(script.parent.resolve()))
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
