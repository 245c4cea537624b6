"""HRDiT's HAP (mmpos.ops.head_scopes) against dense SDPA: time ratio at growing token counts.

The authors' FLUX.1 scope plan (every head: alpha 2048, beta 0 -> a band of 63 blocks of 64 image tokens) with
anchors every 32 blocks (their default), behind 512 text tokens; one layer's attention, ``--heads`` heads of
``--dim`` channels. Prints, per image side in tokens, the dense SDPA time, HAP's, their ratio and the fraction of
the ``L x L`` logits HAP keeps. The paper's claim (2.9x faster attention at 2K, 5.5x at 4K) is on a GPU with
FlexAttention; on the CPU, HAP here is gathered blocks through SDPA with a mask.

    OMP_NUM_THREADS=1 python benchmarks/bench_hap.py --sides 64 96 128          # CPU, fp32 (1024 to 2048 px)
    python benchmarks/bench_hap.py --device cuda --dtype bfloat16 --heads 24 --dim 128 --sides 128 256
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks.timing import median_seconds
from mmpos.ops.head_scopes import HeadScopes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sides", type=int, nargs="+", default=[64, 96, 128], help="image side in tokens")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--text", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    args = parser.parse_args(argv)
    dtype = DTYPES[args.dtype]
    scopes = HeadScopes((2048.0,) * args.heads, (0.0,) * args.heads, text_tokens=args.text, anchor_stride=32)
    print(f"{'side':>5} {'tokens':>7} {'dense s':>9} {'HAP s':>9} {'dense/HAP':>10} {'kept':>6}")
    for side in args.sides:
        length = args.text + side * side
        q, k, v = (torch.randn(1, length, args.heads, args.dim, device=args.device, dtype=dtype) for _ in range(3))

        def dense():
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

        dense_s = median_seconds(dense, args.device, args.repeats)
        hap_s = median_seconds(lambda: scopes.attend(q, k, v), args.device, args.repeats)
        kept = _kept_fraction(scopes, length)
        print(f"{side:5d} {length:7d} {dense_s:9.3f} {hap_s:9.3f} {dense_s / hap_s:10.2f} {kept:6.2f}", flush=True)
    return 0


def _kept_fraction(scopes: HeadScopes, length: int) -> float:
    """Share of the ``L x L`` logits the first head computes (text rows dense; image rows: text, band, anchors)."""
    image, blocks = length - scopes.text_tokens, -(-(length - scopes.text_tokens) // scopes.block)
    half = scopes.half_widths(length)[0]
    band = min(2 * half + 1, blocks) * scopes.block
    anchors = sum(1 for b in range(0, blocks, scopes.stride())) * scopes.block
    return (scopes.text_tokens * length + image * (scopes.text_tokens + band + anchors)) / length**2


if __name__ == "__main__":
    raise SystemExit(main())
