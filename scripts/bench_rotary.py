"""Rotary apply benchmark (see ``mmpos.bench.rotary``); ``python scripts/bench_rotary.py --help``."""
from mmpos.bench.rotary import main

if __name__ == "__main__":
    raise SystemExit(main())
