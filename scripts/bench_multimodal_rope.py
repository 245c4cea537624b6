"""Multimodal RoPE benchmark (see ``mmpos.bench.multimodal``); ``python scripts/bench_multimodal_rope.py --help``."""
import sys

from mmpos.bench.multimodal import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
