"""Rotary apply benchmark: mmpos vs diffusers, timm, rotary-embedding-torch and a copy of q and k.

rotary-embedding-torch is optional (``pip install 'mmpos-toolbox[bench]'``): without it its rows are skipped, with a note.

Each method rotates q and k of one shape with its own precomputed table (table building is not timed);
the time is the median over repeats. GB/s counts one read and one write of q and k. Errors are against
the rotation computed in fp64 from fp64 tables, in units of the dtype's ulp at the reference value (the
bf16 criterion; near-cancelled fp32 outputs make it large for every fp32 method) and at the norm of
the channel's rotation pair.
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch
from timing import median_seconds, write_results

SHAPES = {  # name: (B, H, L, D, axes_dims)
    "flux": ((1, 24, 4608, 128), (16, 56, 56)),
    "wan1.3b": ((1, 12, 32760, 128), (44, 42, 42)),
    "vit-b": ((64, 12, 197, 64), (32, 32)),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def shape_coords(name: str, length: int) -> torch.Tensor:
    from mmpos.coords.grids import flux_ids, grid_coords

    if name == "flux":
        return flux_ids(64, 64, text_length=length - 64 * 64)  # 1024x1024 image (64x64 tokens) + 512 text
    if name.startswith("wan"):
        return grid_coords((21, 30, 52))  # 480x832, 81 frames, patch (1, 2, 2) after the 8x VAE
    side = int((length - 1) ** 0.5)
    return grid_coords((side, side))  # 14x14 patches after one cls token


def make_methods(pe, coords, shape, dtype):
    """name -> callable(x) rotating one tensor, each with the peer's own table format."""
    from diffusers.models.embeddings import apply_rotary_emb as diffusers_apply
    from timm.layers.pos_embed_sincos import apply_rot_embed_cat

    n = shape[2] - coords.shape[0]  # prefix tokens (cls) for the ViT shape
    table = pe.table(coords, dtype)
    cos_sin64 = pe.table(coords, torch.float64)
    cos = cos_sin64.cos.repeat_interleave(2, -1).float()
    sin = cos_sin64.sin.repeat_interleave(2, -1).float()
    angles = torch.angle(cos_sin64.cis).repeat_interleave(2, -1).float()
    if n:
        pad = lambda t, v: torch.cat([torch.full_like(t[:n], v), t])  # identity rotation on the prefix
        cos, sin, angles = pad(cos, 1.0), pad(sin, 0.0), pad(angles, 0.0)
    timm_emb = torch.cat([sin, cos], dim=-1)
    methods = {
        "copy (floor)": lambda x: x.clone(),
        "mmpos": lambda x: pe.rotate(x, table),
        "diffusers apply_rotary_emb": lambda x: diffusers_apply(x, (cos, sin)),
        "timm apply_rot_embed_cat": lambda x: apply_rot_embed_cat(x, timm_emb),
    }
    ret_apply = optional_peer("rotary_embedding_torch", "apply_rotary_emb", "rotary-embedding-torch")
    if ret_apply is not None:
        methods["rotary-embedding-torch"] = lambda x: ret_apply(angles, x)
    if coords.device.type == "cuda" and triton_available():
        methods["mmpos without Triton"] = lambda x: _without_triton(pe.rotate, x, table)
    return methods


_NOTED = set()


def optional_peer(module: str, attribute: str, package: str):
    """``module.attribute`` of an optional peer (the ``bench`` extra), or ``None`` with a note printed once."""
    try:
        return getattr(__import__(module, fromlist=[attribute]), attribute)
    except ImportError:
        if package not in _NOTED:
            _NOTED.add(package)
            print(
                f"note: {package} is not installed; its rows are skipped "
                f"(pip install 'mmpos-toolbox[bench]' or pip install {package})"
            )
        return None


def triton_available() -> bool:
    """Whether the chosen rotary backend (``MMPOS_TRITON=1``: ``"auto"``) takes the fused kernel on CUDA."""
    from mmpos.ops.backends import fused_kernel_enabled

    return fused_kernel_enabled()


def _without_triton(fn, *args):
    from mmpos.ops import rotary_backend

    with rotary_backend("torch"):
        return fn(*args)


def reference(pe, x, coords) -> torch.Tensor:
    return pe.rotate(x.double(), pe.table(coords, torch.float64))


def ulp(reference: torch.Tensor, dtype) -> torch.Tensor:
    mantissa = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}[dtype]
    tiny = torch.finfo(dtype).tiny
    return 2.0 ** (torch.floor(torch.log2(reference.abs().clamp_min(tiny))) - mantissa)


def pair_norm(x: torch.Tensor) -> torch.Tensor:
    """Per channel, the norm of its interleaved rotation pair (rotations preserve it)."""
    pairs = x.unflatten(-1, (-1, 2))
    return pairs.norm(dim=-1, keepdim=True).expand_as(pairs).flatten(-2)


def time_call(fn, q, k, repeats: int) -> float:
    return median_seconds(lambda: (fn(q), fn(k)), q.device, repeats)


def bench_shape(name: str, dtype_name: str, repeats: int, log=print, device: str = "cpu") -> list[dict]:
    import mmpos

    (b, h, length, d), axes_dims = SHAPES[name]
    dtype = DTYPES[dtype_name]
    coords = shape_coords(name, length)
    prefix = length - coords.shape[0]
    pe = mmpos.create_pe("rope_axial", head_dim=d, axes_dims=axes_dims, num_prefix_tokens=prefix)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, length, d, generator=gen).to(device, dtype)
    k = torch.randn(b, h, length, d, generator=gen).to(device, dtype)
    coords = coords.to(device)
    exact = reference(pe, q, coords)
    spacing = ulp(exact, dtype)
    norm_spacing = ulp(pair_norm(q.double()), dtype)
    rows = []
    for method, fn in make_methods(pe, coords, (b, h, length, d), dtype).items():
        seconds = time_call(fn, q, k, repeats)
        err = norm_err = None
        if method != "copy (floor)":
            abs_err = (fn(q).double() - exact).abs()
            err = (abs_err / spacing).max().item()
            norm_err = (abs_err / norm_spacing).max().item()
        rows.append(
            dict(
                shape=name,
                dims=[b, h, length, d],
                dtype=dtype_name,
                device=device,
                method=method,
                ms=seconds * 1e3,
                gb_per_s=2 * 2 * q.numel() * q.element_size() / seconds / 1e9,
                max_err_ulp=err,
                max_err_norm_ulp=norm_err,
            )
        )
        log(
            f"  {name:8s} {dtype_name:5s} {method:28s} {seconds * 1e3:9.2f} ms"
            + (f"  max err {err:10.3f} ulp, {norm_err:7.3f} ulp of |pair|" if err is not None else "")
        )
    by = {r["method"]: r["ms"] for r in rows}
    for r in rows:
        r["vs_floor"] = r["ms"] / by["copy (floor)"]
        r["mmpos_speedup"] = r["ms"] / by["mmpos"]
    return rows


def summary(rows: list[dict]) -> str:
    lines = [
        "| shape | dtype | method | ms (q+k) | GB/s | x copy | mmpos speed-up | max err (ulp) "
        "| max err (ulp of pair norm) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        err = "-" if r["max_err_ulp"] is None else f"{r['max_err_ulp']:.3g}"
        norm_err = "-" if r["max_err_norm_ulp"] is None else f"{r['max_err_norm_ulp']:.3g}"
        lines.append(
            f"| {r['shape']} | {r['dtype']} | {r['method']} | {r['ms']:.1f} | {r['gb_per_s']:.2f} | "
            f"{r['vs_floor']:.2f} | {r['mmpos_speedup']:.1f}x | {err} | {norm_err} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    from mmpos._arguments import OneLineErrorParser, positive_int_arg

    parser = OneLineErrorParser(
        prog="mmpos bench --", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument(
        "--repeats", type=positive_int_arg, default=5, help="timed repeats per method (median reported)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (timed with a synchronize per repeat)")
    parser.add_argument(
        "--threads", type=positive_int_arg, default=None, help="torch.set_num_threads (default: torch's)"
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_rotary.json"), help="JSON results file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    rows = []
    for name in args.shapes:
        for dtype_name in args.dtypes:
            rows += bench_shape(name, dtype_name, args.repeats, device=args.device)
    print(summary(rows))
    meta = dict(
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        machine=platform.machine(),
        device=torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
    )
    write_results(args.out, meta, results=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
