"""DiT training-step benchmark: mmpos' reference DiT with each learned encoding, against NoPE, at real token counts.

Run it as ``python benchmarks/bench_backbones.py --part dit [options]``.
Presets (``--preset``): ``dit-b2`` (DiT-B/2 blocks: hidden 768, 12 heads of 64, 256 tokens: 256 px latents) and
``flux-like`` (Flux's attention: 24 heads of 128, hidden 3072, 4096 tokens: a 1024 px image; single-stream DiT
blocks, no text). ``--depth`` blocks (default 2 on the CPU, the preset's real depth on CUDA): the cost of the
encoding per block is what is compared, so a short stack shows it at the real attention shape.
A step is forward + MSE + backward (a denoising loss on random latents). Encodings are timed round-robin
(one step each per round, median). Learned encodings start away from their identity initialisation
(HARoPE's parameters ~N(0, 0.02^2)), as after some training: at ``M = I`` its exponentials are free.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from backbones_vit import DTYPES, VARIANTS, away_from_identity  # beside this script
from timing import machine_meta, write_results  # beside this script

BASELINE = "nope"
ENCODINGS = ["nope", "rope_axial", "rope_mixed", "comrope_ap", "comrope_ld", "harope"]
PRESETS = {  # name: (DiT options, real depth)
    "dit-b2": (dict(hidden_size=768, num_heads=12, patch_size=2, sample_size=32), 12),
    "flux-like": (dict(hidden_size=3072, num_heads=24, patch_size=2, sample_size=128), 57),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="bench_backbones.py --part dit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument(
        "--dtype", choices=list(DTYPES), default=None, help="autocast dtype (default: bf16 on cuda, fp32 on cpu)"
    )
    parser.add_argument("--preset", choices=list(PRESETS), nargs="+", default=["dit-b2"])
    parser.add_argument("--depth", type=int, default=None, help="blocks (default: 2 on cpu, the preset's on cuda)")
    parser.add_argument("--batch-size", type=int, default=None, help="default: 2 on cpu, 16 on cuda")
    parser.add_argument("--encodings", nargs="+", default=ENCODINGS)
    parser.add_argument("--rounds", type=int, default=5, help="round-robin rounds over the encodings")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (cpu)")
    parser.add_argument(
        "--clock",
        choices=("wall", "process"),
        default="wall",
        help="'process': this process's CPU time (steadier with --threads 1 on a loaded machine)",
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_backbones_dit.json"))
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    if args.clock == "process" and args.device.startswith("cuda"):
        parser.error("--clock process times the CPU; use wall on cuda")
    return args


def build_model(name: str, preset: str, depth: int, device, pe_options: dict | None = None):
    from mmpos.models import DiT

    torch.manual_seed(0)
    model = DiT(**PRESETS[preset][0], depth=depth, in_channels=4, num_classes=10, pe=name, pe_options=pe_options)
    return away_from_identity(model).to(device).train()


def run_preset(args, preset: str, device, log=print) -> list[dict]:
    depth = args.depth or (2 if device.type == "cpu" else PRESETS[preset][1])
    batch = args.batch_size or (2 if device.type == "cpu" else 16)
    names = [BASELINE] + [n for n in args.encodings if n != BASELINE]
    models = {
        label: build_model(name, preset, depth, device, options)
        for name in names
        for label, options in VARIANTS.get(name, {name: {}}).items()
    }
    size = PRESETS[preset][0]["sample_size"]
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(batch, 4, size, size, generator=g).to(device)
    target = torch.randn(batch, 4, size, size, generator=g).to(device)
    timesteps = torch.randint(0, 1000, (batch,), generator=g).to(device)
    labels = torch.randint(0, 10, (batch,), generator=g).to(device)
    autocast = torch.autocast(device.type, dtype=DTYPES[args.dtype]) if args.dtype != "fp32" else nullcontext()

    def step(model):
        with autocast:
            loss = F.mse_loss(model(latents, timesteps, labels, return_dict=False)[0], target)
        loss.backward()
        for p in model.parameters():
            p.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize()

    clock = time.process_time if args.clock == "process" else time.perf_counter
    times = {name: [] for name in models}
    for model in models.values():  # warm-up
        step(model)
    for _ in range(args.rounds):
        for name, model in models.items():
            start = clock()
            step(model)
            times[name].append(clock() - start)
    base = statistics.median(times[BASELINE])
    tokens = (size // PRESETS[preset][0]["patch_size"]) ** 2
    rows = []
    for name in models:
        ms = statistics.median(times[name]) * 1e3
        rows.append(
            dict(
                part="dit",
                preset=preset,
                encoding=name,
                depth=depth,
                batch=batch,
                tokens=tokens,
                device=device.type,
                dtype=args.dtype,
                ms=ms,
                vs_nope=ms / (base * 1e3),
            )
        )
        log(f"  {preset} {name:12s} {ms:9.1f} ms/step  x{ms / (base * 1e3):.3f} vs nope")
    return rows


def summary(rows: list[dict]) -> str:
    lines = [
        "| preset | tokens | depth | batch | encoding | ms / step (fwd+bwd) | vs NoPE |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {r['tokens']} | {r['depth']} | {r['batch']} | {r['encoding']} | "
            f"{r['ms']:.1f} | {r['vs_nope']:.3f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, {args.dtype}"
    )
    rows = [row for preset in args.preset for row in run_preset(args, preset, device)]
    print(summary(rows))
    meta = machine_meta(args.device, args.dtype, rounds=args.rounds, clock=args.clock)
    write_results(args.out, meta, results=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
