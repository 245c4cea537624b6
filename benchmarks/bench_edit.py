"""Cost of each edit per transformer forward, against the stock forward on the same inputs (same run).

A FLUX-shaped transformer (24 heads x 128, axes (16, 56, 56); few blocks, random weights) is run on the token
counts of a real edit: band modulation with a batch of [reference, 2 targets]; Kontext band scaling and LooseRoPE
with target + context image; PE transplant (ids only: its cost is the stock one). Reported: median ms per
forward, ratio to stock, peak memory (CUDA) and the maximum deviation of the edited output from stock (shows the
edit is on).
"""
from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from timing import median_seconds

SIZES = {  # name: (image side in tokens, text length, double blocks, single blocks, heads of 128, text width)
    "flux1024": (64, 512, 1, 2, 24, 4096),
    "small": (16, 64, 1, 1, 2, 256),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_transformer(num_double: int, num_single: int, heads: int, text_dim: int, dtype, device):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(in_channels=64, out_channels=64, num_layers=num_double,
                                   num_single_layers=num_single, attention_head_dim=128, num_attention_heads=heads,
                                   joint_attention_dim=text_dim, pooled_projection_dim=768, guidance_embeds=True,
                                   axes_dims_rope=(16, 56, 56))
    return model.to(device=device, dtype=dtype).eval()


def _inputs(batch, side, text_len, text_dim, kontext, dtype, device):
    from mmpos.coords import flux_ids

    ids = flux_ids(side, side)
    if kontext:
        ids = torch.cat([ids, flux_ids(side, side, index=1.0)])
    g = torch.Generator().manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    return dict(hidden_states=rand(batch, ids.shape[0], 64), encoder_hidden_states=rand(batch, text_len, text_dim),
                pooled_projections=rand(batch, 768), timestep=torch.ones(batch, device=device, dtype=dtype),
                guidance=torch.full((batch,), 3.5, device=device, dtype=torch.float32),
                img_ids=ids.to(device), txt_ids=torch.zeros(text_len, 3, device=device), return_dict=False)


def _scheduler_at_first_step(device):
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(28, device=device)
    return scheduler


def _time(fn, repeats: int, device) -> tuple[float, torch.Tensor]:
    """(median milliseconds over ``repeats`` calls, the output of the untimed warm-up call)."""
    out = fn()
    return median_seconds(fn, device, repeats, warmup=0) * 1e3, out


def _reset_peak(device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _peak_mib(device):
    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if device.type == "cuda" else None


def cases(side: int):
    """name -> (kontext, batch, rules factory(transformer, num_layers) -> EditContext)."""
    from mmpos.pipelines import BandConfig, EditContext, LooseConfig
    from mmpos.pipelines.band import ContextBandScaling, SharedBandAttention
    from mmpos.pipelines.loose import LooseRoPERule

    axes = (16, 56, 56)
    pixels = side * 16
    crop = torch.zeros(pixels, pixels, dtype=torch.bool)
    crop[pixels // 4: 3 * pixels // 4, pixels // 4: 3 * pixels // 4] = True
    saliency = torch.linspace(0, 1, pixels * pixels).reshape(pixels, pixels)

    def band(transformer, n):
        rule = SharedBandAttention(BandConfig(), axes)
        return EditContext(rules={i: rule for i in range(n)})

    def band_kontext(transformer, n):
        rule = ContextBandScaling(BandConfig(), axes)
        return EditContext(rules={i: rule for i in range(n)})

    def loose(transformer, n):
        rule = LooseRoPERule(LooseConfig(saliency_blur=0), transformer.pos_embed, saliency, crop)
        return EditContext(rules={i: rule for i in range(n)})

    return {"band (shared attention, batch 3)": (False, 3, band),
            "band kontext (context keys)": (True, 1, band_kontext),
            "looserope (5 bins, 1/4 of tokens pasted)": (True, 1, loose)}


def run(size: str = "small", dtype: str = "bf16", device: str = "cpu", repeats: int = 5) -> list[dict]:
    from mmpos.pipelines import EditSession

    side, text_len, num_double, num_single, heads, text_dim = SIZES[size]
    device = torch.device(device)
    torch_dtype = DTYPES[dtype]
    transformer = build_transformer(num_double, num_single, heads, text_dim, torch_dtype, device)
    scheduler = _scheduler_at_first_step(device)
    rows = []
    for name, (kontext, batch, factory) in cases(side).items():
        inputs = _inputs(batch, side, text_len, text_dim, kontext, torch_dtype, device)
        with torch.no_grad():
            _reset_peak(device)
            stock_ms, stock = _time(lambda: transformer(**inputs)[0], repeats, device)
            stock_peak = _peak_mib(device)
            _reset_peak(device)
            with EditSession(transformer, factory(transformer, num_double + num_single), scheduler):
                edit_ms, edited = _time(lambda: transformer(**inputs)[0], repeats, device)
            edit_peak = _peak_mib(device)
        rows.append(dict(case=name, tokens=inputs["hidden_states"].shape[1] + text_len, batch=batch,
                         stock_ms=round(stock_ms, 3), edit_ms=round(edit_ms, 3), ratio=round(edit_ms / stock_ms, 3),
                         stock_peak_mib=stock_peak, peak_mib=edit_peak,
                         max_change=float((edited.float() - stock.float()).abs().max())))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="outputs/bench_edit.json")
    args = parser.parse_args(argv)
    rows = run(args.size, args.dtype, args.device, args.repeats)
    print(f"{'case':44s} {'tokens':>7s} {'stock ms':>9s} {'edit ms':>9s} {'ratio':>6s} {'peak MiB stock/edit':>20s} "
          f"{'max change':>10s}")
    for r in rows:
        peaks = f"{r['stock_peak_mib']}/{r['peak_mib']}" if r["peak_mib"] is not None else "-"
        print(f"{r['case']:44s} {r['tokens']:7d} {r['stock_ms']:9.2f} {r['edit_ms']:9.2f} {r['ratio']:6.2f} "
              f"{peaks:>20s} {r['max_change']:10.3g}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(size=args.size, dtype=args.dtype, device=args.device, torch=torch.__version__,
                platform=platform.platform())
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
