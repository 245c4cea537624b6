"""Training-free PE edits on Flux: ``python scripts/edit.py {band,transplant,loose} [options]``.

Same as ``mmpos edit ...``; see ``--help`` of each method and configs/edit_*.yaml.
"""

import sys

from mmpos.pipelines.commands import main

if __name__ == "__main__":
    sys.exit(main(["edit", *sys.argv[1:]]))
