"""Flux transformer forward time with mmpos processors relative to the stock diffusers model.

A tiny-but-realistic Flux: a few double- and single-stream blocks at head dim 128, 4096 image tokens
(a 1024x1024 image) and 512 text tokens, random weights. Variants, measured in one run on one model
(reported: median and minimum forward time, and the median of per-round ratios to stock):

* ``stock``: diffusers' ``FluxAttnProcessor`` and ``FluxPosEmbed`` (tables rebuilt every forward);
* ``mmpos native``: mmpos processors and seam, stock arithmetic (bit-identical output);
* ``mmpos rope_axial``: the same encoding with mmpos' rotation operator;
* ``mmpos rope_mixed``: learned per-head 3-axis frequencies;
* ``no rotation``: ``pe="nope"``, the floor (what RoPE costs at all).

Each variant is a copy of the model's modules sharing its parameters; every round runs one forward of each
variant (rotating order) after a warm-up that caches its table, as in sampling.

Target: mmpos processors at most 3% over stock.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
from pathlib import Path

import torch
from timing import write_results  # beside this script

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
        model = FluxTransformer2DModel(
            patch_size=1,
            in_channels=64,
            num_layers=double_blocks,
            num_single_layers=single_blocks,
            attention_head_dim=128,
            num_attention_heads=heads,
            joint_attention_dim=256,
            pooled_projection_dim=64,
            axes_dims_rope=(16, 56, 56),
        )
    return model.to(device, dtype).eval()


def flux_inputs(side: int, text: int, device, dtype) -> dict:
    from mmpos.coords.grids import flux_ids

    gen = torch.Generator().manual_seed(0)
    ids = flux_ids(side, side, text_length=text, device=device)
    tensors = dict(
        hidden_states=torch.randn(1, side * side, 64, generator=gen),
        encoder_hidden_states=torch.randn(1, text, 256, generator=gen),
        pooled_projections=torch.randn(1, 64, generator=gen),
    )
    inputs = {k: v.to(device, dtype) for k, v in tensors.items()}
    return dict(inputs, timestep=torch.tensor([0.5], device=device), img_ids=ids[text:], txt_ids=ids[:text])


def variant_model(base, variant: str):
    """``base`` with the variant's encoding, as new modules sharing ``base``'s parameters (no weight copies)."""
    from mmpos.integrations.diffusers import set_pe

    model = copy.deepcopy(base, memo={id(p): p for p in base.parameters()})
    if VARIANTS[variant] is not None:
        pe, options = VARIANTS[variant]
        set_pe(model, pe, **options)
    return model


def timed_forward(model, inputs, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.no_grad():
        model(**inputs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def bench(base, inputs, device, rounds: int, log=print) -> dict[str, list[float]]:
    """One forward per variant per round, the order rotating each round, so that drift hits all alike."""
    models = {name: variant_model(base, name) for name in VARIANTS}
    for model in models.values():
        timed_forward(model, inputs, device)  # warm-up: builds and caches the table
    samples = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            samples[name].append(timed_forward(models[name], inputs, device))
        if (r + 1) % max(1, rounds // 4) == 0 or r + 1 == rounds:
            log(
                f"  {r + 1}/{rounds} rounds: "
                + ", ".join(f"{n} {statistics.median(s) * 1e3:.1f} ms" for n, s in samples.items())
            )
    return samples


def summarise(samples: dict[str, list[float]]) -> list[dict]:
    """Per variant: median and minimum time, and the median over rounds of (variant / stock) in the same round
    (paired: robust to drift on a shared machine; the minimum resists noise, which only ever adds time)."""
    stock = samples["stock"]
    return [
        dict(
            variant=name,
            ms=statistics.median(s) * 1e3,
            ms_min=min(s) * 1e3,
            vs_stock=statistics.median(a / b for a, b in zip(s, stock)),
            vs_stock_min=min(s) / min(stock),
            samples=len(s),
        )
        for name, s in samples.items()
    ]


def check_native_output(base, inputs) -> bool:
    """``pe="native"`` gives the stock model's bits on this device and dtype."""
    with torch.no_grad():
        return bool(torch.equal(base(**inputs).sample, variant_model(base, "mmpos native")(**inputs).sample))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench_backbones --part flux", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument(
        "--heads", type=int, default=None, help="attention heads (default: 24 = Flux on cuda, 2 on cpu)"
    )
    parser.add_argument("--double-blocks", type=int, default=2)
    parser.add_argument("--single-blocks", type=int, default=2)
    parser.add_argument("--side", type=int, default=64, help="image tokens per side (64 -> 4096 tokens)")
    parser.add_argument("--text", type=int, default=512, help="text tokens")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of one timed forward per variant")
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
    print(
        f"Flux: {args.double_blocks}+{args.single_blocks} blocks, {heads} heads x 128, "
        f"{args.side * args.side}+{args.text} tokens, {dtype}, {device}, torch {torch.__version__}"
    )
    native_exact = check_native_output(model, inputs)
    samples = bench(model, inputs, device, args.rounds)
    rows = summarise(samples)
    print(
        "| variant | ms / forward (median) | ms (min) | vs stock (median of paired ratios) | vs stock (min) |\n"
        "|---|---|---|---|---|"
    )
    for row in rows:
        print(
            f"| {row['variant']} | {row['ms']:.1f} | {row['ms_min']:.1f} | {row['vs_stock']:.3f} | "
            f"{row['vs_stock_min']:.3f} |"
        )
    print(f"pe='native' output bit-identical to stock: {native_exact}")
    meta = dict(
        device=str(device),
        dtype=str(dtype),
        heads=heads,
        blocks=[args.double_blocks, args.single_blocks],
        tokens=[args.side * args.side, args.text],
        torch=torch.__version__,
        machine=platform.machine(),
        threads=torch.get_num_threads(),
        native_bit_identical=native_exact,
    )
    write_results(args.out, meta, results=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
