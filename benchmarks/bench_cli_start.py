"""Wall-clock start of the ``mmpos`` command: ``mmpos --help``, every ``mmpos COMMAND ... --help`` and ``mmpos list``
(which reads the encoding registry, so it imports torch), each in a fresh process, median of ``--repeats`` runs.

    python benchmarks/bench_cli_start.py              # prints one row per command and the slowest --help

Issue 31 asks for every ``--help`` under 2 s on a 2-core machine; the test (``tests/commands/test_cli_fast_start.py``)
checks the deterministic property behind it (no torch, diffusers, timm, transformers or accelerate imported
while parsing), this script only prints times.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time


def start_seconds(argv: list[str], repeats: int) -> float:
    """Median wall-clock seconds of ``python -m mmpos.cli ARGV`` in a fresh process."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "mmpos.cli", *argv], capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per command (default: 3)")
    args = parser.parse_args(argv)
    from mmpos.pipelines.commands import build_parser, command_paths

    print(
        f"{platform.node()} {platform.processor() or platform.machine()}, python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}: median of {args.repeats} fresh processes"
    )
    helps = {}
    for words in command_paths(build_parser()):
        helps[words] = start_seconds([*words, "--help"], args.repeats)
        print(f"  {' '.join(['mmpos', *words, '--help']):34s} {helps[words]:6.2f} s")
    print(f"  {'mmpos list':34s} {start_seconds(['list'], args.repeats):6.2f} s  (reads the registry: imports torch)")
    slowest = max(helps, key=helps.get)
    print(f"slowest --help: mmpos {' '.join(slowest)} {helps[slowest]:.2f} s (target: under 2 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
