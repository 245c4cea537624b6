"""Flux transformer forward time with mmpos processors relative to the stock diffusers model.

A tiny-but-realistic Flux: a few double- and single-stream blocks at head dim 128, 4096 image tokens
(a 1024x1024 image) and 512 text tokens, random weights. Variants, measured in one run on one model
(switched with ``set_pe``/``restore``, round-robin so that drift hits all alike; median of the timed
forwards, each variant warmed up after every switch so its table is cached as in sampling):

* ``stock``: diffusers' ``FluxAttnProcessor`` and ``FluxPosEmbed`` (tables rebuilt every forward);
* ``mmpos native``: mmpos processors and seam, stock arithmetic (bit-identical output);
* ``mmpos rope_axial``: the same encoding with mmpos' rotation operator;
* ``mmpos rope_mixed``: learned per-head 3-axis frequencies;
* ``no rotation``: ``pe="nope"``, the floor (what RoPE costs at all).

Target: mmpos processors at most 3% over stock.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

VARIANTS = {  # name: (pe, options) or None for the stock model
    "stock": None,
    "mmpos native": ("native", {}),
    "mmpos rope_axial": ("rope_axial", {}),
    "mmpos rope_mixed": ("rope_mixed", {}),
    "no rotation": ("nope", {}),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_flux(heads: int, double_blocks: int, single_blocks: int, device, dtype):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    with torch.device(device):  # initialise on the device: a 24-head model has ~1e9 parameters
        model = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=double_blocks,
                                       num_single_layers=single_blocks, attention_head_dim=128,
                                       num_attention_heads=heads, joint_attention_dim=256, pooled_projection_dim=64,
                                       axes_dims_rope=(16, 56, 56))
    return model.to(device, dtype).eval()


def flux_inputs(side: int, text: int, device, dtype) -> dict:
    from ..coords.grids import flux_ids

    gen = torch.Generator().manual_seed(0)
    ids = flux_ids(side, side, text_length=text, device=device)
    tensors = dict(hidden_states=torch.randn(1, side * side, 64, generator=gen),
                   encoder_hidden_states=torch.randn(1, text, 256, generator=gen),
                   pooled_projections=torch.randn(1, 64, generator=gen))
    inputs = {k: v.to(device, dtype) for k, v in tensors.items()}
    return dict(inputs, timestep=torch.tensor([0.5], device=device), img_ids=ids[text:], txt_ids=ids[:text])


def switch(model, variant: str):
    from ..integrations.diffusers import restore, set_pe

    if getattr(model, "_mmpos_installed", None) is not None:
        restore(model)
    if VARIANTS[variant] is not None:
        pe, options = VARIANTS[variant]
        set_pe(model, pe, **options)


def timed_forward(model, inputs, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.no_grad():
        model(**inputs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def bench(model, inputs, device, rounds: int, repeats: int, log=print) -> dict[str, list[float]]:
    samples = {name: [] for name in VARIANTS}
    for r in range(rounds):
        for name in VARIANTS:
            switch(model, name)
            timed_forward(model, inputs, device)  # warm-up: builds and caches the table
            samples[name] += [timed_forward(model, inputs, device) for _ in range(repeats)]
        log(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {statistics.median(s) * 1e3:.1f} ms"
                                                    for n, s in samples.items()))
    switch(model, "stock")
    return samples


def summarise(samples: dict[str, list[float]]) -> list[dict]:
    """Median and minimum per variant, and their ratios to stock (the minimum resists a loaded machine's
    noise, which only ever adds time)."""
    stock_median, stock_min = statistics.median(samples["stock"]), min(samples["stock"])
    return [dict(variant=name, ms=statistics.median(s) * 1e3, vs_stock=statistics.median(s) / stock_median,
                 ms_min=min(s) * 1e3, vs_stock_min=min(s) / stock_min, samples=len(s)) for name, s in samples.items()]


def check_native_output(model, inputs) -> bool:
    """``pe="native"`` gives the stock model's bits on this device and dtype."""
    with torch.no_grad():
        switch(model, "stock")
        stock = model(**inputs).sample
        switch(model, "mmpos native")
        ours = model(**inputs).sample
    switch(model, "stock")
    return bool(torch.equal(stock, ours))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench_backbones --part flux", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--heads", type=int, default=None, help="attention heads (default: 24 = Flux on cuda, 2 on cpu)")
    parser.add_argument("--double-blocks", type=int, default=2)
    parser.add_argument("--single-blocks", type=int, default=2)
    parser.add_argument("--side", type=int, default=64, help="image tokens per side (64 -> 4096 tokens)")
    parser.add_argument("--text", type=int, default=512, help="text tokens")
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds over the variants")
    parser.add_argument("--repeats", type=int, default=3, help="timed forwards per variant and round")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (cpu)")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_backbones_flux.json"))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    heads = args.heads or (24 if device.type == "cuda" else 2)
    model = build_flux(heads, args.double_blocks, args.single_blocks, device, dtype)
    inputs = flux_inputs(args.side, args.text, device, dtype)
    print(f"Flux: {args.double_blocks}+{args.single_blocks} blocks, {heads} heads x 128, "
          f"{args.side * args.side}+{args.text} tokens, {dtype}, {device}, torch {torch.__version__}")
    native_exact = check_native_output(model, inputs)
    samples = bench(model, inputs, device, args.rounds, args.repeats)
    rows = summarise(samples)
    print("| variant | ms / forward (median) | vs stock | ms (min) | vs stock (min) |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['variant']} | {row['ms']:.1f} | {row['vs_stock']:.3f} | {row['ms_min']:.1f} | "
              f"{row['vs_stock_min']:.3f} |")
    print(f"pe='native' output bit-identical to stock: {native_exact}")
    meta = dict(device=str(device), dtype=str(dtype), heads=heads, blocks=[args.double_blocks, args.single_blocks],
                tokens=[args.side * args.side, args.text], torch=torch.__version__, machine=platform.machine(),
                threads=torch.get_num_threads(), native_bit_identical=native_exact)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(meta=meta, results=rows), indent=1))
    print(f"wrote {args.out}")
    return 0
