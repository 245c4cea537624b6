"""One timing loop for the benchmarks (median wall time, synchronising CUDA around each call) and one way to write
their results."""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import torch


def median_seconds(fn, device, repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after ``warmup`` untimed ones."""
    cuda = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def write_results(out, meta: dict, indent: int = 1, **tables) -> None:
    """``{"meta": meta, **tables}`` as JSON in ``out`` (its folder made), and one line saying so."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(meta=meta, **tables), indent=indent))
    print(f"wrote {out}")


def machine_meta(device, dtype, **extra) -> dict:
    """A results file's ``meta``: torch version, device, dtype, torch threads and machine, then ``extra``."""
    return dict(
        torch=torch.__version__,
        device=device,
        dtype=dtype,
        threads=torch.get_num_threads(),
        machine=platform.machine(),
        **extra,
    )


def timed(step, device) -> tuple[float, torch.Tensor]:
    """``(seconds, step())``: one call of ``step`` timed, synchronising CUDA before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out
