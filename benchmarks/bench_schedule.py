"""Cost of DyPE's table rebuilds against a denoising step, at a FLUX-like shape (4096 image + 512 text tokens).

DyPE changes the spectrum at every step, so the position module rebuilds its tables once per step (once per
distinct sigma). This times that rebuild (resolve the schedule, fp64 phases, stock cos/sin) through ``set_pe``'s
seam, and one transformer forward with FLUX.1-dev's widths (24 heads x 128, joint dim 4096) but only
``--double`` + ``--single`` blocks, then prints the rebuild's share of that forward and of a full 19 + 38 block
step (the forward scaled by blocks; a lower bound of the real step, so the share is an upper bound).

    OMP_NUM_THREADS=1 python scripts/bench_schedule.py            # CPU, fp32
    python scripts/bench_schedule.py --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import time

import torch
from diffusers import FluxTransformer2DModel

from mmpos.coords.grids import flux_ids
from mmpos.integrations.diffusers import model_extrapolation, set_pe

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def timed(fn, repeats: int, device: str, warmup: bool = True) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls (after one warm-up call)."""
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", type=int, default=64, help="image tokens per side (64: 4096 tokens, 1024 px)")
    parser.add_argument("--text", type=int, default=512)
    parser.add_argument("--double", type=int, default=1)
    parser.add_argument("--single", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed forwards (CPU: no warm-up forward)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    args = parser.parse_args(argv)
    device, dtype = args.device, DTYPES[args.dtype]

    torch.manual_seed(0)
    model = (
        FluxTransformer2DModel(
            patch_size=1,
            in_channels=64,
            num_layers=args.double,
            num_single_layers=args.single,
            attention_head_dim=128,
            num_attention_heads=24,
            joint_attention_dim=4096,
            pooled_projection_dim=768,
            guidance_embeds=True,
            axes_dims_rope=(16, 56, 56),
        )
        .to(device, dtype)
        .eval()
    )
    # trained at half the grid: DyPE at 2x, a new sigma at every call forces a rebuild
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", (args.grid // 2, args.grid // 2)))
    ids = flux_ids(args.grid, args.grid, text_length=args.text, device=device)
    seam, sigmas = model.pos_embed, iter(torch.linspace(1.0, 0.01, 10_000).tolist())

    def rebuild():
        seam.encodings[0].step.sigma = next(sigmas)
        seam(ids)

    rebuild_s = timed(rebuild, args.repeats * 4, device)
    tokens = args.grid * args.grid
    inputs = dict(
        hidden_states=torch.randn(1, tokens, 64, device=device, dtype=dtype),
        encoder_hidden_states=torch.randn(1, args.text, 4096, device=device, dtype=dtype),
        pooled_projections=torch.randn(1, 768, device=device, dtype=dtype),
        timestep=torch.tensor([0.5], device=device),
        guidance=torch.tensor([3.5], device=device),
        img_ids=ids[args.text :],
        txt_ids=ids[: args.text],
    )
    with torch.inference_mode():
        forward_s = timed(lambda: model(**inputs), args.repeats, device, warmup=device != "cpu")
    blocks = args.double + args.single
    step_s = forward_s * 57 / blocks
    print(
        f"shape: {tokens} image + {args.text} text tokens, axes (16, 56, 56), {device} {args.dtype}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"table rebuild (DyPE, new sigma): {rebuild_s * 1e3:.2f} ms")
    print(
        f"forward with {args.double} + {args.single} blocks: {forward_s * 1e3:.0f} ms; "
        f"FLUX.1 step (19 + 38 blocks, scaled): {step_s:.1f} s"
    )
    print(
        f"rebuild / {blocks}-block forward: {100 * rebuild_s / forward_s:.3f}%   "
        f"rebuild / full step: {100 * rebuild_s / step_s:.4f}%"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
