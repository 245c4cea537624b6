"""Print the tables of the diffusers families: the shipped families (README.md, "Supported diffusers models"; the
forward-time column from ``benchmarks/bench_families.py --out``'s JSON) and the excluded rotary classes
(docs/adding_a_family.md, "Coverage"); with ``--write``, put them between their markers in those pages of a checkout.

    python -m mmpos.integrations.diffusers.families --timings assets/results/families/bench_families.json --write
"""

import argparse
import json
from pathlib import Path

from ...._atomic import written_atomically
from . import markdown_table
from .coverage import exclusions_table

ROOT = Path(__file__).resolve().parents[4]
PAGES = {"families-table": ROOT / "README.md", "exclusions-table": ROOT / "docs" / "adding_a_family.md"}


def write_between_markers(page: Path, marker: str, table: str) -> None:
    """Replace the text between ``<!-- marker:start -->`` and ``<!-- marker:end -->`` lines of ``page`` by ``table``."""
    text = page.read_text(encoding="utf-8")
    start, end = f"<!-- {marker}:start -->\n", f"\n<!-- {marker}:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"{page}: no {start.strip()} ... {end.strip()} markers")
    head, rest = text.split(start, 1)
    with written_atomically(page) as temporary:
        temporary.write_text(head + start + table + end + rest.split(end, 1)[1], encoding="utf-8")


parser = argparse.ArgumentParser(
    prog="python -m mmpos.integrations.diffusers.families", description=__doc__.split("\n\n")[0]
)
parser.add_argument("--timings", type=Path, help="benchmarks/bench_families.py --out JSON (the forward-time column)")
parser.add_argument("--write", action="store_true", help="write the tables into README.md and docs/adding_a_family.md")
args = parser.parse_args()
timings = None
if args.timings is not None:
    try:
        timings = json.loads(args.timings.read_text())
    except (OSError, ValueError) as error:
        parser.error(f"--timings {args.timings}: {error}")
tables = {"families-table": markdown_table(timings), "exclusions-table": exclusions_table()}
if args.write:
    for marker, table in tables.items():
        write_between_markers(PAGES[marker], marker, table)
        print(f"wrote {marker} in {PAGES[marker]}")
else:
    print("\n\n".join(tables.values()))
