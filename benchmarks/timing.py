"""One timing loop for the benchmarks: median wall time, synchronising CUDA around each call."""

from __future__ import annotations

import statistics
import time

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
