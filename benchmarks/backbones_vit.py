"""ViT training-step benchmark: one timm ViT converted to each registered image encoding, against NoPE.

Run it as ``python benchmarks/bench_backbones.py --part vit [options]``.
Every model is the same timm architecture (default ViT-S/16 at 224 px) converted with
:func:`mmpos.integrations.timm.convert`; ``nope`` is the baseline (stock timm attention, no positions).
A step is forward + cross-entropy + backward. Models are timed round-robin (one step each per round,
``rounds`` rounds of ``repeats`` steps, median reported) so that load drift on a shared machine hits all of them alike.
Targets (issue 4): rotary encodings at most 10 % over NoPE, HARoPE and ComRoPE at most 25 %.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from contextlib import nullcontext
from fnmatch import fnmatch
from pathlib import Path

import torch
import torch.nn.functional as F
from timing import machine_meta, write_results  # beside this script

BASELINE = "nope"
TARGETS = {"harope*": 1.25, "comrope*": 1.25, "*": 1.10}  # rotary encodings: max step time / NoPE's
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
WRAPPERS = ("harope",)  # encodings that wrap a grid-reading one (not listed by image_pes)
# rows per encoding: label -> convert options (HARoPE's map folded into the qkv weights, and applied per token)
VARIANTS = {"harope": {"harope": {}, "harope (map per token)": {"fold_qkv": False}}}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="bench_backbones.py --part vit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument(
        "--dtype", choices=list(DTYPES), default=None, help="autocast dtype (default: bf16 on cuda, fp32 on cpu)"
    )
    parser.add_argument("--model", default="vit_small_patch16_224", help="timm architecture")
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=None, help="default: 8 on cpu, 64 on cuda")
    parser.add_argument(
        "--encodings",
        nargs="+",
        default=None,
        help="default: every registered encoding that reads 2D coordinates, and harope",
    )
    parser.add_argument("--rounds", type=int, default=5, help="round-robin rounds over the encodings")
    parser.add_argument("--repeats", type=int, default=1, help="timed steps per encoding and round")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (cpu)")
    parser.add_argument(
        "--clock",
        choices=("wall", "process"),
        default="wall",
        help="'process' counts this process's CPU time (with --threads 1 on a shared, loaded "
        "machine it is far less noisy than wall time); cuda always uses wall time",
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_backbones_vit.json"))
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}"
    )
    rows = run(args)
    print(summary(rows))
    meta = machine_meta(args.device, args.dtype, rounds=args.rounds, repeats=args.repeats, clock=args.clock)
    write_results(args.out, meta, results=rows)
    return 0


def target_for(name: str, kind: str) -> float | None:
    if kind != "rotary":
        return None
    return next(limit for pattern, limit in TARGETS.items() if fnmatch(name, pattern))


def build_models(args, device) -> dict:
    import timm

    from mmpos.encodings import pe_class
    from mmpos.integrations.timm import convert
    from mmpos.integrations.timm.models import image_pes

    names = args.encodings or image_pes() + list(WRAPPERS)
    if BASELINE not in names:
        names = [BASELINE] + list(names)
    models = {}
    for name in names:
        for label, options in VARIANTS.get(name, {name: {}}).items():
            torch.manual_seed(0)
            model = convert(timm.create_model(args.model, img_size=args.img_size, num_classes=1000), pe=name, **options)
            models[label] = (away_from_identity(model).to(device).train(), pe_class(name).kind)
    return models


def away_from_identity(model):
    """HARoPE's maps start at ``M = I``, where its exponentials are free: start them at ~N(0, 0.02^2) parameters,
    as after some training."""
    from mmpos.encodings.harope import HARoPE

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, HARoPE):
                for p in (module.u_skew, module.v_skew, module.sigma):
                    p.normal_(std=0.02)
    return model


def run(args, log=print) -> list[dict]:
    device = torch.device(args.device)
    batch = args.batch_size or (64 if device.type == "cuda" else 8)
    models = build_models(args, device)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, args.img_size, args.img_size, generator=g).to(device)
    labels = torch.randint(0, 1000, (batch,), generator=g).to(device)
    autocast = torch.autocast(device.type, dtype=DTYPES[args.dtype]) if args.dtype != "fp32" else nullcontext()

    def step(model):
        with autocast:
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        for p in model.parameters():
            p.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize()

    clock = time.process_time if args.clock == "process" and device.type == "cpu" else time.perf_counter
    times = {name: [] for name in models}
    for _ in range(2):  # warm-up: allocator, tables, kernels
        for model, _kind in models.values():
            step(model)
    for _ in range(args.rounds):
        for name, (model, _kind) in models.items():
            for _ in range(args.repeats):
                start = clock()
                step(model)
                times[name].append(clock() - start)
    base = statistics.median(times[BASELINE])
    rows = []
    for name, (_model, kind) in models.items():
        ms = statistics.median(times[name]) * 1e3
        ratio = ms / (base * 1e3)
        limit = target_for(name, kind)
        rows.append(
            dict(
                part="vit",
                model=args.model,
                encoding=name,
                kind=kind,
                batch=batch,
                img_size=args.img_size,
                device=device.type,
                dtype=args.dtype,
                ms=ms,
                vs_nope=ratio,
                target=limit,
                meets_target=None if limit is None else ratio <= limit,
            )
        )
        log(f"  vit {name:14s} {kind:9s} {ms:9.1f} ms/step  x{ratio:.3f} vs nope")
    return rows


def summary(rows: list[dict]) -> str:
    lines = ["| encoding | kind | ms / step (fwd+bwd) | vs NoPE | target | met |", "|---|---|---|---|---|---|"]
    for r in rows:
        target = "-" if r["target"] is None else f"<= {r['target']:.2f}"
        met = "-" if r["meets_target"] is None else ("yes" if r["meets_target"] else "NO")
        lines.append(f"| {r['encoding']} | {r['kind']} | {r['ms']:.1f} | {r['vs_nope']:.3f} | {target} | {met} |")
    first = rows[0]
    lines.append(
        f"\n{first['model']}, batch {first['batch']}, {first['img_size']} px, {first['device']}, {first['dtype']}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
