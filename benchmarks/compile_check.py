"""``torch.compile`` check of a converted timm ViT with each learned encoding: graph breaks reported by
``torch._dynamo.explain`` for a training forward (a script, not a test: tracing takes seconds per model).

    python benchmarks/compile_check.py [--encodings rope_mixed comrope_ap ...] [--depth 2]

Prints, per encoding, the graph count, graph-break count and the break reasons (deduplicated).
"""
from __future__ import annotations

import argparse

import torch

ENCODINGS = ["rope_axial", "rope_mixed", "comrope_ap", "comrope_ld", "harope"]


def explain(name: str, depth: int, img_size: int):
    import timm

    from mmpos.integrations.timm import convert

    torch._dynamo.reset()
    model = convert(timm.create_model("vit_tiny_patch16_224", img_size=img_size, depth=depth, num_classes=10),
                    pe=name).train()
    images = torch.randn(2, 3, img_size, img_size)
    return torch._dynamo.explain(model)(images)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encodings", nargs="+", default=ENCODINGS)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--img-size", type=int, default=64)
    args = parser.parse_args(argv)
    print("| encoding | graphs | graph breaks | reasons |\n|---|---|---|---|")
    for name in args.encodings:
        result = explain(name, args.depth, args.img_size)
        reasons = sorted({str(b.reason).splitlines()[0][:120] for b in result.break_reasons})
        print(f"| {name} | {result.graph_count} | {result.graph_break_count} | {'; '.join(reasons) or '-'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
