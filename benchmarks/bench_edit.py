"""Cost of each editing pipeline's denoising step with its edit on vs off (same pipeline, same run).

A FLUX-shaped transformer (heads of 128, axes (16, 56, 56); few blocks, random weights) runs one step at the
token counts of a real edit (``flux1024`` / ``flux-tokens``: 64 x 64 latent patches = 4096 image tokens, 512 text
tokens; Kontext doubles the image tokens): PE transplant on Fill (ids rewritten in the transplant window), band
modulation on a ``[reference, 2 targets]`` batch (also against plain shared attention, the band law off) and
LooseRoPE on Kontext. "off" is the pipeline with ``enabled=False`` (the edit processors installed, falling
through). The variants of a case are interleaved call by call; reported: median ms per step, the ratio to the
case's baseline, the attention work the method implies (:mod:`edit_cases`), whether "off" equals the stock
forward bit for bit, the largest change "on" makes (shows the edit is on) and, on CUDA, each variant's peak memory.
``--families flux2 qwen`` times band modulation through the edit seam, PE transplant (Klein / Qwen-Image
inpainting) and LooseRoPE (Klein edit / Qwen-Image-Edit; :mod:`family_edit_cases`) on FLUX.2- and
Qwen-Image-shaped transformers at the same token counts instead.
"""

from __future__ import annotations

import argparse
import platform
import statistics

import torch
from edit_cases import MODEL_CHANNELS, cases, family_band_case
from family_edit_cases import build_family_transformer, family_rows, verdict  # beside this script
from timing import timed, write_results

SIZES = {  # name: (image side in tokens, text length, double blocks, single blocks, heads of 128, text width)
    "flux1024": (64, 512, 1, 2, 24, 4096),
    "flux-tokens": (64, 512, 1, 1, 1, 256),  # real token counts, one head: fits a CPU
    "small": (16, 64, 1, 1, 2, 256),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FAMILIES = ("flux2", "qwen")  # --families: band modulation on these architectures through the edit seam


def _family_inputs(family, batch, side, text_len, text_dim, dtype, device):
    """One step's inputs: ``side x side`` image tokens and ``text_len`` text tokens (FLUX.2 ids ``(t, h, w, l)``;
    Qwen-Image ``img_shapes`` and a text mask)."""
    g = torch.Generator().manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    timestep = torch.ones(batch, device=device, dtype=dtype)
    if family == "flux2":
        axis = lambda n: torch.arange(n, dtype=torch.float32)  # noqa: E731
        img_ids = torch.cartesian_prod(axis(1), axis(side), axis(side), axis(1))
        txt_ids = torch.cartesian_prod(axis(1), axis(1), axis(1), axis(text_len))
        return dict(
            hidden_states=rand(batch, side * side, 128),
            encoder_hidden_states=rand(batch, text_len, text_dim),
            timestep=timestep,
            img_ids=img_ids.to(device),
            txt_ids=txt_ids.to(device),
            return_dict=False,
        )
    return dict(
        hidden_states=rand(batch, side * side, 64),
        encoder_hidden_states=rand(batch, text_len, text_dim),
        encoder_hidden_states_mask=torch.ones(batch, text_len, dtype=torch.bool, device=device),
        timestep=timestep,
        img_shapes=[[(1, side, side)]] * batch,
        return_dict=False,
    )


def build_transformer(
    num_double: int, num_single: int, heads: int, text_dim: int, dtype, device, in_channels: int = 64
):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(
        in_channels=in_channels,
        out_channels=64,
        num_layers=num_double,
        num_single_layers=num_single,
        attention_head_dim=128,
        num_attention_heads=heads,
        joint_attention_dim=text_dim,
        pooled_projection_dim=768,
        guidance_embeds=True,
        axes_dims_rope=(16, 56, 56),
    )
    return model.to(device=device, dtype=dtype).eval()


def _inputs(model, batch, side, text_len, text_dim, dtype, device):
    from mmpos.coords import flux_ids

    ids = flux_ids(side, side)
    if model == "kontext":
        ids = torch.cat([ids, flux_ids(side, side, index=1.0)])
    g = torch.Generator().manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    return dict(
        hidden_states=rand(batch, ids.shape[0], MODEL_CHANNELS[model]),
        encoder_hidden_states=rand(batch, text_len, text_dim),
        pooled_projections=rand(batch, 768),
        timestep=torch.ones(batch, device=device, dtype=dtype),  # sigma 1: the first step
        guidance=torch.full((batch,), 3.5, device=device, dtype=torch.float32),
        img_ids=ids.to(device),
        txt_ids=torch.zeros(text_len, 3, device=device),
        return_dict=False,
    )


def _scheduler_at_first_step(device):
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(28, device=device)
    return scheduler


def _reset_peak(device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _peak_mib(device):
    """Peak CUDA memory (MiB) since the last reset; None on other devices."""
    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if device.type == "cuda" else None


def time_case(case, transformer, inputs, scheduler, repeats: int, device) -> dict:
    """Interleaved medians (ms) and peak memory of each variant, the implied work ratio, and the checks of the
    stock / off / on outputs."""
    from mmpos.pipelines import EditContext, EditSession

    step = lambda: transformer(**inputs)[0]  # noqa: E731
    with torch.no_grad():
        stock = step()
        context = EditContext(rules=dict(case.rules))
        with EditSession(transformer, context, scheduler):
            outputs, peaks, samples = {}, {}, {name: [] for name in case.variants}
            for name, configure in case.variants.items():  # warm-up, and each variant's output and peak memory
                configure(context)
                _reset_peak(device)
                outputs[name] = step()
                peaks[name] = _peak_mib(device)
                if name == "on":
                    implied = case.implied(
                        context, inputs["encoder_hidden_states"].shape[1], inputs["hidden_states"].shape[1]
                    )
            for _ in range(repeats):
                for name, configure in case.variants.items():
                    configure(context)
                    seconds, _ = timed(step, device)
                    samples[name].append(seconds)
    ms = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
    return dict(
        ms=ms,
        peak_mib=peaks,
        implied=implied,
        off_equals_stock=bool(torch.equal(outputs["off"], stock)),
        max_change=float((outputs["on"].float() - stock.float()).abs().max()),
    )


def _row(case, inputs, result, text_len) -> dict:
    return dict(
        case=case.name,
        tokens=inputs["hidden_states"].shape[1] + text_len,
        batch=case.batch,
        ms={k: round(v, 2) for k, v in result["ms"].items()},
        peak_mib=result["peak_mib"],
        on_vs_off=round(result["ms"]["on"] / result["ms"]["off"], 3),
        **verdict(case, result),
    )


def run_families(
    families, size: str = "small", dtype: str = "bf16", device: str = "cpu", repeats: int = 5
) -> list[dict]:
    """Band modulation (on, plain shared attention, off), then PE transplant and LooseRoPE (on, off), on FLUX.2- /
    Qwen-Image-shaped transformers."""
    side, text_len, num_double, num_single, heads, text_dim = SIZES[size]
    device, torch_dtype = torch.device(device), DTYPES[dtype]
    scheduler = _scheduler_at_first_step(device)
    rows = []
    for family in families:
        model = build_family_transformer(family, num_double, num_single, heads, text_dim, torch_dtype, device)
        case = family_band_case(family, num_double + num_single)
        inputs = _family_inputs(family, case.batch, side, text_len, text_dim, torch_dtype, device)
        rows.append(_row(case, inputs, time_case(case, model, inputs, scheduler, repeats, device), text_len))
        rows += family_rows(family, SIZES[size], torch_dtype, device, repeats, timed)
    return rows


def run(
    size: str = "small", dtype: str = "bf16", device: str = "cpu", repeats: int = 5, only: tuple = ()
) -> list[dict]:
    side, text_len, num_double, num_single, heads, text_dim = SIZES[size]
    device, torch_dtype = torch.device(device), DTYPES[dtype]
    build = lambda channels: build_transformer(
        num_double,
        num_single,
        heads,
        text_dim,
        torch_dtype,  # noqa: E731
        device,
        channels,
    )
    models = {"flux": build(64), "fill": build(384)}
    models["kontext"] = models["flux"]  # Kontext is the Flux architecture on [target | context] tokens
    scheduler = _scheduler_at_first_step(device)
    rows = []
    for case in cases(num_double + num_single, side, models["kontext"].pos_embed):
        if only and not any(word in case.name for word in only):
            continue
        inputs = _inputs(case.model, case.batch, side, text_len, text_dim, torch_dtype, device)
        result = time_case(case, models[case.model], inputs, scheduler, repeats, device)
        rows.append(_row(case, inputs, result, text_len))
    return rows


def _print(rows) -> None:
    print(
        f"{'case':46s} {'tokens':>6s} {'ms per step':32s} {'on/off':>6s} {'target':26s} {'ratio':>6s} "
        f"{'implied':>7s} {'off==stock':>10s} {'max change':>10s}"
    )
    for r in rows:
        ms = " ".join(f"{k} {v:.0f}" for k, v in r["ms"].items())
        print(
            f"{r['case']:46s} {r['tokens']:6d} {ms:32s} {r['on_vs_off']:6.2f} {r['target']:26s} {r['ratio']:6.2f} "
            f"{r['implied_attention_work']:7.2f} {str(r['off_equals_stock']):>10s} {r['max_change']:10.3g}"
        )
        if any(r["peak_mib"].values()):
            print("    peak MiB: " + ", ".join(f"{k} {v}" for k, v in r["peak_mib"].items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=(), help="cases whose name contains one of these words")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument(
        "--families",
        nargs="*",
        choices=FAMILIES,
        default=None,
        help="time band modulation, PE transplant and LooseRoPE on these architectures (FLUX.2, "
        "Qwen-Image) instead of FLUX.1's three edits",
    )
    parser.add_argument("--out", default="outputs/bench_edit.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.families is not None:
        rows = run_families(args.families or FAMILIES, args.size, args.dtype, args.device, args.repeats)
    else:
        rows = run(args.size, args.dtype, args.device, args.repeats, tuple(args.only))
    _print(rows)
    meta = dict(
        size=args.size,
        dtype=args.dtype,
        device=args.device,
        repeats=args.repeats,
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        platform=platform.platform(),
    )
    write_results(args.out, meta, indent=2, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
