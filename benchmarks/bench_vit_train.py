"""Train-step throughput of a ViT-S/16 converted with mmpos vs timm's own RoPE-Mixed model (same weights).

Models, timed round-robin in one process (forward + backward + AdamW step, fixed random batch):

* ``timm rope_mixed``: ``vit_small_patch16_rope_mixed_224`` as timm builds it (the reference);
* ``mmpos rope_mixed``: a copy of it converted to mmpos ``rope_mixed`` (timm's learned frequencies taken over:
  the same function, checked before timing);
* ``mmpos nope``: a copy converted to ``nope`` (the same network without positions: the baseline);
* ``mmpos <pe>`` for each other ``--pes`` encoding.

    OMP_NUM_THREADS=1 python benchmarks/bench_vit_train.py --batch-size 4 --rounds 3              # CPU
    OMP_NUM_THREADS=1 python benchmarks/bench_vit_train.py --batch-size 4 --rounds 3 --no-cls     # average pooling
    python benchmarks/bench_vit_train.py --device cuda --dtype bf16 --batch-size 128 --rounds 20   # GPU

Prints images/s per model, the ratio to timm's model and the step time relative to ``nope``
(issue 16 targets: mmpos rope_mixed >= 0.95x timm's throughput; rotary <= 1.10x NoPE's step time,
1.25x for HARoPE/ComRoPE).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import timm
import torch

import mmpos.integrations.timm as mmpos_timm

TIMM_MIXED = "vit_small_patch16_rope_mixed_224"


def build_models(pes, device, dtype, no_cls: bool = False) -> dict:
    torch.manual_seed(0)
    pooling = dict(class_token=False, global_pool="avg") if no_cls else {}
    reference = timm.create_model(TIMM_MIXED, pretrained=False, num_classes=1000, **pooling)
    models = {"timm rope_mixed": reference}
    for pe in ("rope_mixed", "nope", *[p for p in pes if p not in ("rope_mixed", "nope")]):
        try:
            models[f"mmpos {pe}"] = mmpos_timm.convert(copy.deepcopy(reference), pe=pe)
        except (ValueError, TypeError) as error:
            print(f"mmpos {pe}: not converted ({error})")
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        gap = (models["mmpos rope_mixed"].eval()(x) - reference.eval()(x)).abs().max().item()
    print(f"mmpos rope_mixed vs timm rope_mixed, same weights: max |logit difference| {gap:.2e}")
    return {name: model.to(device=device).train() for name, model in models.items()}


def step_seconds(model, optimizer, images, labels, device_type, dtype) -> float:
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    sync()
    clock = time.perf_counter if device_type == "cuda" else time.process_time
    start = clock()
    with torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync()
    return clock() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="timed steps per model (after one warm-up)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--pes", nargs="+", default=["rope_axial", "comrope_ld", "harope"])
    parser.add_argument("--no-cls", action="store_true", help="no cls token, average pooling (all models)")
    parser.add_argument("--out", help="JSON file for the numbers")
    args = parser.parse_args(argv)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    device = torch.device(args.device)
    models = build_models(args.pes, device, dtype, args.no_cls)
    optimizers = {n: torch.optim.AdamW(m.parameters(), lr=1e-5) for n, m in models.items()}
    images = torch.randn(args.batch_size, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (args.batch_size,), device=device)
    times = {name: [] for name in models}
    for round_index in range(args.rounds + 1):  # round 0 warms up
        for name, model in models.items():
            seconds = step_seconds(model, optimizers[name], images, labels, device.type, dtype)
            if round_index:
                times[name].append(seconds)
    medians = {name: statistics.median(t) for name, t in times.items()}
    clock = "wall" if device.type == "cuda" else "CPU (process) time"
    print(f"\nbatch {args.batch_size}, {args.rounds} rounds, {args.device} {args.dtype}, median {clock}:")
    print("| model | ms / step | images/s | throughput vs timm rope_mixed | step time vs mmpos nope |")
    print("|---|---|---|---|---|")
    rows = {}
    for name, seconds in medians.items():
        rows[name] = {
            "ms_per_step": 1000 * seconds,
            "images_per_s": args.batch_size / seconds,
            "vs_timm": medians["timm rope_mixed"] / seconds,
            "vs_nope": seconds / medians["mmpos nope"],
        }
        r = rows[name]
        print(
            f"| {name} | {r['ms_per_step']:.0f} | {r['images_per_s']:.2f} | {r['vs_timm']:.2f}x | {r['vs_nope']:.2f}x |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
