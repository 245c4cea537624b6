"""Backbone benchmarks, each a ratio against its baseline measured in the same run.

Parts (each a module in ``mmpos.bench`` with ``add_arguments(parser)``, ``run(args, log) -> rows`` and
``summary(rows) -> str``; a part whose module is absent is skipped):

* ``vit``: timm ViT-S/16 forward+backward step per registered image encoding vs NoPE (``backbones_vit``);
* ``flux``: Flux transformer forward with mmpos attention processors vs stock (``backbones_flux``).

    python scripts/bench_backbones.py --parts vit --repeats 5
    python scripts/bench_backbones.py --device cuda --dtype bf16
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
from pathlib import Path

import torch

PARTS = {"vit": "mmpos.bench.backbones_vit", "flux": "mmpos.bench.backbones_flux"}


def available_parts() -> dict:
    found = {}
    for name, module in PARTS.items():
        try:
            found[name] = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
    return found


def main(argv=None) -> int:
    parts = available_parts()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=list(parts), choices=list(parts))
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="autocast dtype")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_backbones.json"))
    for module in parts.values():
        module.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}")
    results = {}
    for name in args.parts:
        print(f"[{name}]")
        results[name] = parts[name].run(args, log=print)
        print(parts[name].summary(results[name]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(torch=torch.__version__, device=args.device, dtype=args.dtype, threads=torch.get_num_threads(),
                machine=platform.machine(), repeats=args.repeats)
    args.out.write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
