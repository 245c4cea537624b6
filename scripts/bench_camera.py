"""Camera-encoding accuracy and speed (see ``mmpos.bench.camera``); ``python scripts/bench_camera.py --help``."""
from mmpos.bench.camera import main

if __name__ == "__main__":
    raise SystemExit(main())
