"""Per-forward cost of each edit vs the stock Flux forward (see ``mmpos.pipelines.bench``); ``--help``."""
from mmpos.pipelines.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
