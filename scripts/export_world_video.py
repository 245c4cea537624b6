"""Assemble finished world-video training stages into one model folder (pipeline, adapters, model card).

python scripts/export_world_video.py --runs runs/video --out assets/world-video --overwrite
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mmpos.pipelines.world.video_export import export_world_video


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="export_world_video",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--runs", required=True, help="folder holding the vae, base and adapter stage folders")
    p.add_argument("--out", required=True, help="model folder to write")
    p.add_argument("--adapters", nargs="+", default=["ucpe", "plucker"], help="adapter stages to include")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = p.parse_args(argv)
    try:
        folder = export_world_video(Path(args.runs), Path(args.out), tuple(args.adapters), args.overwrite)
    except (FileExistsError, FileNotFoundError, ValueError) as error:
        p.exit(2, f"{p.prog}: error: {error}\n")
    print(f"wrote {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
