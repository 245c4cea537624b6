"""Stock FLUX.1 text-to-image from configs/generate.yaml: ``python scripts/generate.py [options]``.

Same as ``mmpos generate ...``.
"""

import sys

from mmpos.pipelines.commands import main

if __name__ == "__main__":
    sys.exit(main(["generate", *sys.argv[1:]]))
