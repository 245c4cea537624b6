"""Print the tables of the diffusers families: the shipped families (README.md, "Supported diffusers models"; the
forward-time column from ``benchmarks/bench_families.py --out``'s JSON) and the excluded rotary classes
(docs/adding_a_family.md, "Coverage").

    python -m mmpos.integrations.diffusers.families --timings assets/results/families/bench_families.json
"""

import argparse
import json
from pathlib import Path

from . import markdown_table
from .coverage import exclusions_table

parser = argparse.ArgumentParser(
    prog="python -m mmpos.integrations.diffusers.families", description=__doc__.split("\n\n")[0]
)
parser.add_argument("--timings", type=Path, help="benchmarks/bench_families.py --out JSON (the forward-time column)")
args = parser.parse_args()
timings = None
if args.timings is not None:
    try:
        timings = json.loads(args.timings.read_text())
    except (OSError, ValueError) as error:
        parser.error(f"--timings {args.timings}: {error}")
print(markdown_table(timings))
print()
print(exclusions_table())
