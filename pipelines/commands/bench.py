"""``mmpos bench``: the rotary apply benchmark of the source checkout (``benchmarks/bench_rotary.py``), arguments
after ``--`` forwarded to it (benchmarks are scripts, not package code)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

BENCH_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_rotary.py"


def register(subparsers) -> None:
    bench = subparsers.add_parser(
        "bench",
        help="rotary apply benchmark against peers (see `mmpos bench -- --help`)",
        description="Run benchmarks/bench_rotary.py; arguments after `--` go to it "
        "(e.g. `mmpos bench -- --shapes flux --dtypes bf16`; its defaults: "
        "`mmpos bench -- --help`). The rotary-embedding-torch peer is optional (pip install "
        "'mmpos-toolbox[bench]'): without it its rows are skipped.",
    )
    bench.add_argument(
        "bench_args",
        nargs=argparse.REMAINDER,
        help="arguments for the benchmark (default: none, the benchmark's own defaults)",
    )
    bench.set_defaults(func=run)


def run(args) -> int:
    if not BENCH_SCRIPT.is_file():
        print(
            f"mmpos bench: {BENCH_SCRIPT} not found; the benchmarks live in the source checkout "
            "(install mmpos with `pip install -e .` from a clone)",
            file=sys.stderr,
        )
        return 2
    forwarded = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    return subprocess.call([sys.executable, str(BENCH_SCRIPT), *forwarded])
