"""``torch.compile`` check of a converted timm ViT with each learned encoding: graph breaks reported by
``torch._dynamo.explain`` for a training forward (a script, not a test: tracing takes seconds per model).

    python benchmarks/compile_check.py [--encodings rope_mixed comrope_ap ...] [--depth 2] [--time]

Prints, per encoding, the graph count, graph-break count and the break reasons (deduplicated). ``--time``
also compiles each model with inductor (``dynamic=True``), times a training step (forward + backward)
eager vs compiled (median of ``--repeats``, after warm-up; ``--model``, ``--batch-size``), and counts the
graphs inductor compiles when the image size changes (``--img-size`` then ``--img-size2``). Every run also
counts the graphs dynamo traces (``dynamic=True``, backend ``eager``) for three image sizes: 1 means that no
guard in the model's code depends on the size. The model uses timm's ``dynamic_img_pad=True``: without it
timm's patch embedding formats the image size into an assertion message, which makes dynamo specialise on it
(one recompilation per size, stock timm too). Under inductor on a CPU, PyTorch's lowering of that patch
convolution adds a size guard of its own (a larger image recompiles once).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

ENCODINGS = ["rope_axial", "rope_mixed", "comrope_ap", "comrope_ld", "harope"]


def explain(name: str, depth: int, img_size: int):
    import timm

    from mmpos.integrations.timm import convert

    torch._dynamo.reset()
    model = convert(
        timm.create_model("vit_tiny_patch16_224", img_size=img_size, depth=depth, num_classes=10), pe=name
    ).train()
    images = torch.randn(2, 3, img_size, img_size)
    return torch._dynamo.explain(model)(images)


def _model(name, depth, img_size, arch="vit_tiny_patch16_224"):
    import timm

    from mmpos.integrations.timm import convert

    torch.manual_seed(0)
    model = timm.create_model(
        arch, img_size=img_size, depth=depth, num_classes=10, dynamic_img_size=True, dynamic_img_pad=True
    )  # unpadded, timm pins the size
    return convert(model, pe=name).train()


def traced_graphs_over_sizes(name: str, depth: int, sizes: tuple) -> int:
    """Graphs dynamo traces (``dynamic=True``, no code generation) for a training step at each of ``sizes``:
    1 means no guard of the model's code depends on the image size."""
    torch._dynamo.reset()
    model = _model(name, depth, sizes[0])
    compiled = torch.compile(model, dynamic=True, backend="eager")
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for size in sizes:
        compiled(torch.randn(2, 3, size, size)).square().mean().backward()
    return torch._dynamo.utils.counters["stats"]["unique_graphs"] - before


def time_compiled(name: str, depth: int, sizes: tuple, repeats: int, arch: str, batch: int) -> dict:
    """Eager and compiled step times at ``sizes[0]``, and the compilations after switching to ``sizes[1]``."""
    torch._dynamo.reset()
    model = _model(name, depth, sizes[0], arch)
    compiled = torch.compile(model, dynamic=True)
    images = {size: torch.randn(batch, 3, size, size) for size in sizes}

    def step(forward, size):
        forward(images[size]).square().mean().backward()
        for p in model.parameters():
            p.grad = None

    def median_ms(forward, size):
        step(forward, size)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            step(forward, size)
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1e3

    eager, fast = median_ms(model, sizes[0]), median_ms(compiled, sizes[0])
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    step(compiled, sizes[1])
    return dict(
        eager_ms=eager, compiled_ms=fast, new_graphs=torch._dynamo.utils.counters["stats"]["unique_graphs"] - before
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encodings", nargs="+", default=ENCODINGS)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--img-size", type=int, default=64)
    parser.add_argument("--img-size2", type=int, default=96, help="second image size for --time")
    parser.add_argument("--time", action="store_true", help="also time eager vs inductor and count recompilations")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default="vit_tiny_patch16_224", help="timm architecture for --time")
    parser.add_argument("--batch-size", type=int, default=2, help="batch for --time")
    args = parser.parse_args(argv)
    sizes = (args.img_size, args.img_size2, args.img_size + 16)
    print(
        f"| encoding | graphs | graph breaks | reasons | traced graphs for sizes {sizes} |"
        + (" eager ms | compiled ms | inductor graphs for a new size |" if args.time else "")
    )
    print("|---|---|---|---|---|" + ("---|---|---|" if args.time else ""))
    for name in args.encodings:
        result = explain(name, args.depth, args.img_size)
        reasons = sorted({str(b.reason).splitlines()[0][:120] for b in result.break_reasons})
        line = (
            f"| {name} | {result.graph_count} | {result.graph_break_count} | {'; '.join(reasons) or '-'} | "
            f"{traced_graphs_over_sizes(name, args.depth, sizes)} |"
        )
        if args.time:
            t = time_compiled(
                name, args.depth, (args.img_size, args.img_size2), args.repeats, args.model, args.batch_size
            )
            line += f" {t['eager_ms']:.1f} | {t['compiled_ms']:.1f} | {t['new_graphs']} |"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
