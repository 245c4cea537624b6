"""Forward time of every registered diffusers family with ``set_pe`` (native, DyPE) over the stock model.

Each family's tiny conformance config (:mod:`mmpos.integrations.diffusers.families.tiny`) runs a forward on ``--scale`` times its
training grid; three copies of the same model, same inputs: stock, ``set_pe(model, "native")`` and DyPE trained at
the case's grid (every step a new sigma, as in sampling, so DyPE rebuilds its tables each forward). Calls are interleaved
round by round; reported: stock's median ms per forward and, per round paired with the stock call of the same round,
the median over rounds of the ratio to stock (target for native: <= 1.02x) and of the absolute overhead
(native - stock, DyPE - stock) in ms. These toy forwards
take a few ms, so a fixed per-forward cost of the hooks (tens of microseconds) shows as a percent here and vanishes
in a real model's forward (hundreds of ms): read the ratio against the overhead column. Native builds its tables
once and reuses them while the call stays the same (as pipelines make it at every step), so it may be faster than
stock, which rebuilds them every forward.

``--clock cpu`` (default) times the process' CPU time (``time.process_time``: on a shared machine the time other
processes hold the cores is not counted; with ``--threads 1`` it is the forward's compute), ``--clock wall`` the
elapsed time. The header prints the load average.

    python benchmarks/bench_families.py --scale 2 --repeats 9 --threads 1

``--out`` writes the rows as JSON (atomically); the README's family table shows them
(``python -m mmpos.integrations.diffusers.families --timings assets/results/families/bench_families.json``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def bench_family(name: str, scale: int, repeats: int, clock=time.process_time) -> dict:
    from mmpos.integrations.diffusers import set_pe
    from mmpos.integrations.diffusers.families import get_family
    from mmpos.integrations.diffusers.families.tiny import CASES, output

    case = CASES[name]
    stock = case.model()
    native, dype = copy.deepcopy(stock), copy.deepcopy(stock)
    set_pe(native, "native")
    set_pe(dype, "native", extrapolation=case.dype(dype))  # ERNIE-Image: DyPE through NTK
    sigmas = iter([1.0 - i / (4 * repeats + 8) for i in range(4 * repeats + 8)])
    rows, cols = case.grid
    inputs = case.inputs(scale * rows, scale * cols)
    timestep = get_family(name).timestep_arg[0]  # the forward's timestep argument

    def forward(model, fresh_sigma=False):
        kwargs = inputs
        if fresh_sigma:  # DyPE: a new sigma per call, on the pipeline's timestep scale
            kwargs = dict(inputs, **{timestep: inputs[timestep] * next(sigmas)})
        with torch.no_grad():
            return output(model(**kwargs, return_dict=False))

    runs = {
        "stock": lambda: forward(stock),
        "native": lambda: forward(native),
        "dype": lambda: forward(dype, fresh_sigma=True),
    }
    for fn in runs.values():
        fn()
    times = {k: [] for k in runs}
    for _ in range(repeats):
        for label, fn in runs.items():
            start = clock()
            fn()
            times[label].append((clock() - start) * 1e3)
    median = {k: statistics.median(v) for k, v in times.items()}
    same = torch.equal(forward(native), forward(stock))
    return {
        "family": name,
        "stock_ms": median["stock"],
        "native_x": paired_ratio(times["native"], times["stock"]),
        "dype_x": paired_ratio(times["dype"], times["stock"]),
        "native_overhead_ms": paired_overhead(times["native"], times["stock"]),
        "dype_overhead_ms": paired_overhead(times["dype"], times["stock"]),
        "native_equals_stock": same,
        "load_average": os.getloadavg()[0],
    }


def paired_ratio(times: list, stock: list) -> float:
    """The median over rounds of ``times[i] / stock[i]``."""
    return statistics.median(t / s for t, s in zip(times, stock))


def paired_overhead(times: list, stock: list) -> float:
    """The median over rounds of ``times[i] - stock[i]`` (ms): each round's pair ran back to back, so a slow spell
    of the machine shifts both."""
    return statistics.median(t - s for t, s in zip(times, stock))


def main(argv=None) -> int:
    from mmpos.integrations.diffusers.families import builtin_families

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--scale", type=int, default=2, help="times each case's training grid (video: 2 frames)")
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="process CPU time or elapsed time")
    parser.add_argument("--families", nargs="*", help="registered family names (default: all)")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if args.scale < 1:
        parser.error(f"--scale must be >= 1, got {args.scale}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    torch.set_num_threads(args.threads)
    names = args.families or builtin_families()
    unknown = sorted(set(names) - set(builtin_families()))
    if unknown:
        parser.error(f"--families: unknown {unknown}; expected some of {builtin_families()}")
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} thread(s), "
        f"{args.scale}x each case's training grid, median of {args.repeats}, {args.clock} clock, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"{'family':<16} {'stock ms':>9} {'native/stock':>13} {'native - stock':>15} {'dype/stock':>11} "
        f"{'dype - stock':>13} {'native == stock':>16} {'load':>5}"
    )
    rows = []
    for name in names:
        row = bench_family(name, args.scale, args.repeats, CLOCKS[args.clock])
        rows.append(row)
        print(
            f"{name:<16} {row['stock_ms']:9.2f} {row['native_x']:12.3f}x {row['native_overhead_ms']:+12.3f} ms "
            f"{row['dype_x']:10.3f}x {row['dype_overhead_ms']:+10.3f} ms {str(row['native_equals_stock']):>16} "
            f"{row['load_average']:5.1f}",
            flush=True,
        )
    if args.out is not None:  # atomic: a reader never sees half a file
        partial = args.out.with_name(f".{args.out.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(rows, indent=1) + "\n")
        os.replace(partial, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
