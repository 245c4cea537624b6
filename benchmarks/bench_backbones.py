"""Backbone benchmarks: ``--part vit`` (timm ViT step time per encoding vs NoPE), ``--part dit`` (DiT-B/2 and
Flux-like block stacks at real token counts, step time per learned encoding vs NoPE), ``--part flux`` (Flux
forward with mmpos processors vs stock diffusers), ``--part all``. Other arguments go to each part
(``python benchmarks/bench_backbones.py --part flux --help``)."""

import argparse
import importlib
import sys

PARTS = {"vit": "backbones_vit", "dit": "backbones_dit", "flux": "backbones_flux"}  # modules beside this script


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, add_help=False)
    parser.add_argument("--part", choices=[*PARTS, "all"], default="all")
    args, rest = parser.parse_known_args(argv)
    if args.part == "all" and {"-h", "--help"} & set(rest):
        parser.print_help()
        return 0
    names = list(PARTS) if args.part == "all" else [args.part]
    status = 0
    for name in names:
        try:
            module = importlib.import_module(PARTS[name])
        except ModuleNotFoundError as err:
            if args.part != "all" or err.name != PARTS[name]:
                raise
            print(f"[{name}] skipped: {PARTS[name]} is not in this checkout")
            continue
        print(f"== {name}")
        status = module.main(rest) or status
    return status


if __name__ == "__main__":
    sys.exit(main())
