"""Learned rotary variants benchmark (see ``mmpos.bench.variants``); ``python scripts/bench_variants.py --help``."""
from mmpos.bench.variants import main

if __name__ == "__main__":
    raise SystemExit(main())
