"""Overhead of the camera adapters on a Wan forward: stock vs ``plucker`` / ``prope`` / ``ucpe`` adapters.

A WanTransformer3DModel with Wan2.1-T2V-1.3B's block shape (width 1536, 12 heads x 128, FFN 8960, text width 4096,
512 text tokens) at reduced depth, random weights; the adapters sized as UCPE's (1 head x 192, one per block).
The camera geometry is built once per call (as the pipelines do), outside the timed forward. Stock and adapter
forwards are interleaved within each repeat, so a change of machine load hits them alike.

    python benchmarks/bench_camera_adapter.py                                   # CPU: 2 blocks, 3 x 8 x 12 tokens
    python benchmarks/bench_camera_adapter.py --device cuda --dtype bfloat16 --frames 21 --rows 30 --cols 52
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from mmpos.camera import preset_trajectory
from mmpos.camera.video import video_cameras
from mmpos.integrations.diffusers.camera_adapter import ADAPTER_KINDS, CameraAdapter, camera_conditioning

WAN_13B_BLOCK = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=12,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=8960,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
)


def milliseconds(fn, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--frames", type=int, default=3, help="latent frames")
    p.add_argument("--rows", type=int, default=8, help="patch rows per frame")
    p.add_argument("--cols", type=int, default=12, help="patch columns per frame")
    p.add_argument("--text", type=int, default=512, help="text tokens")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--kinds", nargs="+", default=list(ADAPTER_KINDS), choices=ADAPTER_KINDS)
    p.add_argument("--out", help="also write the results to this JSON file (a new file)")
    args = p.parse_args(argv)
    from diffusers import WanTransformer3DModel

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(**WAN_13B_BLOCK, num_layers=args.layers).to(args.device).eval()
    if dtype != torch.float32:
        transformer = transformer.to(dtype=dtype)
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, args.frames, 2 * args.rows, 2 * args.cols, generator=g).to(args.device, dtype)
    text = torch.randn(1, args.text, 4096, generator=g).to(args.device, dtype)
    timestep = torch.tensor([500], device=args.device)
    tokens = args.frames * args.rows * args.cols
    cameras = video_cameras(
        preset_trajectory("orbit", 4 * args.frames - 3),
        (args.frames, args.rows, args.cols),
        (16 * args.rows, 16 * args.cols),
        device=args.device,
    )

    def forward():
        with torch.no_grad():
            transformer(hidden_states=latents, timestep=timestep, encoder_hidden_states=text)

    print(
        f"Wan-1.3B-like blocks x {args.layers}, {tokens} video tokens + {args.text} text, {args.device} "
        f"{args.dtype}, median of {args.repeats}"
    )
    adapters = {kind: CameraAdapter.for_transformer(transformer, kind).eval() for kind in args.kinds}

    def run(kind):
        if kind == "stock":
            return milliseconds(forward, args.device)
        with camera_conditioning(transformer, adapters[kind], cameras):
            return milliseconds(forward, args.device)

    times = {kind: [] for kind in ["stock", *args.kinds]}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for kind in times:
            ms = run(kind)
            if repeat:
                times[kind].append(ms)
    results = {f"{kind}_ms": statistics.median(values) for kind, values in times.items()}
    print(f"stock    {results['stock_ms']:9.1f} ms")
    for kind in args.kinds:
        ms = results[f"{kind}_ms"]
        params = sum(p.numel() for p in adapters[kind].parameters()) / args.layers
        print(f"{kind:8s} {ms:9.1f} ms  x{ms / results['stock_ms']:.3f}  ({params / 1e6:.2f}M parameters per block)")
    if args.out:
        path = Path(args.out)
        if path.exists():
            p.exit(2, f"--out {path}: exists; choose a new file\n")
        path.write_text(json.dumps(dict(vars(args), **results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
