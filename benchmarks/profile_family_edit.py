"""CPU time of one forward of each family edit case, off vs on, by the PyTorch profiler (the total self CPU time
of the forward's operators: a cross-check of ``bench_edit.py --families`` when the machine's load makes wall-clock
medians noisy; CPU only).

    OMP_NUM_THREADS=1 python benchmarks/profile_family_edit.py --size flux-tokens
"""

from __future__ import annotations

import argparse

import bench_edit
import family_edit_cases
import torch
from torch.profiler import ProfilerActivity, profile


def cpu_seconds(step) -> float:
    step()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return sum(event.self_cpu_time_total for event in prof.key_averages()) / 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(bench_edit.SIZES), default="small")
    parser.add_argument("--dtype", choices=sorted(bench_edit.DTYPES), default="bf16")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    size, dtype, device = bench_edit.SIZES[args.size], bench_edit.DTYPES[args.dtype], torch.device("cpu")
    for family in bench_edit.FAMILIES:
        model = family_edit_cases.build_family_transformer(family, *size[2:6], dtype, device)
        for case in (
            family_edit_cases.transplant_case(family, model, size, dtype, device),
            family_edit_cases.loose_case(family, model, size, dtype, device),
        ):
            seconds = {}
            with torch.no_grad():
                for name, make in case.variants.items():
                    with make():
                        seconds[name] = cpu_seconds(lambda: model(**case.inputs)[0])
            print(
                f"{case.name:62s} off {seconds['off']:.2f} s  on {seconds['on']:.2f} s  "
                f"on/off {seconds['on'] / seconds['off']:.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
