"""Camera encodings: accuracy in 16-bit against fp64, and attention time against plain SDPA, in one run.

Accuracy (``--check``): each encoding's output (attention output for prope/ucpe/rayrope, the 6D rays for
plucker) with fp32 geometry and bf16 q/k/v on ``--device``, against fp64 geometry and fp64 q/k/v on the CPU.
The error is ``max |out - ref| / max |ref|``; the same measure for plain SDPA in bf16 is printed beside it
(what bf16 attention costs anyway), so the ratio shows what the encoding adds.

Speed: median milliseconds of one attention call with the encoding (geometry prepared once, as it is shared
by all layers and steps) and of plain SDPA on the same q, k, v, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from timing import median_seconds

SHAPES = {  # name: (batch, heads, head_dim, cameras, (rows, cols), image (H, W))
    "tiny": (1, 2, 48, 3, (6, 8), (96, 128)),
    "lvsm": (1, 8, 144, 3, (32, 32), (256, 256)),  # RayRoPE's NVS setting: 2 context + 1 target view
    "wan1.3b": (1, 12, 96, 21, (30, 52), (480, 832)),  # 480x832, 81 frames -> 21 latent frames (PRoPE/UCPE)
}
VIDEO_SHAPES = ("wan1.3b",)  # many cameras: encodings that attend once per query camera (predicts_depth) are left out


def camera_encodings() -> list[str]:
    """Every registered camera encoding (the registry is the one list of kinds)."""
    from mmpos.encodings import list_pes

    return list_pes("camera")


def make_rig(cameras: int, batch: int, dtype=torch.float64, seed: int = 0):
    """A smooth orbit rig: ``(c2w [B, C, 4, 4], intrinsics [B, C, 3, 3] for image (H, W) set later)``."""
    from mmpos.camera.presets import preset_trajectory

    g = torch.Generator().manual_seed(seed)
    trajectory = preset_trajectory("arc", cameras, degrees=50.0)
    c2w = trajectory.c2w.to(dtype)[None].repeat(batch, 1, 1, 1)
    c2w[..., :3, 3] += torch.randn(batch, cameras, 3, generator=g, dtype=dtype) * 0.05
    return c2w, trajectory


def build(name: str, head_dim: int, cameras: int, batch: int, grid, image, dtype, device):
    """(encoding, run(q, k, v) -> output) with geometry in ``dtype`` on ``device``, through the contract: the
    attention output, or for an additive encoding its geometry (the embedded rays)."""
    from mmpos.camera import Cameras
    from mmpos.camera.rays import ray_grid
    from mmpos.encodings import pe_class

    c2w, trajectory = make_rig(cameras, batch)
    height, width = image
    k_pixels = trajectory.intrinsic_matrices(width, height)[None].repeat(batch, 1, 1, 1)
    rays, valid = ray_grid(trajectory.camera(0, width, height), grid, dtype=dtype, device=device)
    rig = Cameras(
        c2w=c2w.to(device, dtype),
        grid=grid,
        image_size=image,
        intrinsics=k_pixels.to(device, dtype),
        rays=rays,
        valid=valid,
    )
    pe = pe_class(name).for_head_dim(head_dim).to(device)
    geometry = pe.prepare(rig)
    if pe.capabilities.additive:
        return pe, lambda q, k, v: geometry
    per_layer = {}
    if pe.capabilities.predicts_depth:
        g = torch.Generator().manual_seed(3)
        raw = torch.randn(batch, rig.num_tokens, 2, generator=g, dtype=torch.float64) * 0.5
        per_layer["depth_q"] = raw.to(device, dtype)
    return pe, lambda q, k, v: pe.attention(q, k, v, geometry, **per_layer)


def check_accuracy(device: str, shape: str = "tiny") -> list[dict]:
    batch, heads, head_dim, cameras, grid, image = SHAPES[shape]
    tokens = cameras * grid[0] * grid[1]
    g = torch.Generator().manual_seed(0)
    q64, k64, v64 = (torch.randn(batch, heads, tokens, head_dim, generator=g, dtype=torch.float64) for _ in range(3))
    sdpa_ref = F.scaled_dot_product_attention(q64, k64, v64)
    q16, k16, v16 = (t.to(device, torch.bfloat16) for t in (q64, k64, v64))
    sdpa_err = _relative_error(F.scaled_dot_product_attention(q16, k16, v16), sdpa_ref)
    rows = []
    for name in camera_encodings():
        _, reference_fn = build(name, head_dim, cameras, batch, grid, image, torch.float64, "cpu")
        _, device_fn = build(name, head_dim, cameras, batch, grid, image, torch.float32, device)
        reference = reference_fn(q64, k64, v64)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            out = device_fn(q16, k16, v16)
        error = _relative_error(out, reference)
        rows.append(
            {
                "encoding": name,
                "device": device,
                "dtype": str(out.dtype).replace("torch.", ""),
                "rel_max_error": error,
                "sdpa_bf16_rel_max_error": sdpa_err if name != "plucker" else None,
                "finite": bool(torch.isfinite(out).all()),
            }
        )
    return rows


def _relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out.double().cpu() - reference).abs().max() / reference.abs().max()).item()


def _median_ms(fn, device: str, repeats: int) -> float:
    return median_seconds(fn, device, repeats, warmup=2) * 1e3


@torch.no_grad()
def benchmark(device: str, shapes, dtype: torch.dtype, repeats: int) -> list[dict]:
    from mmpos.encodings import pe_capabilities

    rows = []
    for shape in shapes:
        batch, heads, head_dim, cameras, grid, image = SHAPES[shape]
        tokens = cameras * grid[0] * grid[1]
        q, k, v = (torch.randn(batch, heads, tokens, head_dim, device=device, dtype=dtype) for _ in range(3))
        sdpa_ms = _median_ms(lambda: F.scaled_dot_product_attention(q, k, v), device, repeats)
        for name in camera_encodings():
            caps = pe_capabilities(name)
            if caps.additive or (caps.predicts_depth and shape in VIDEO_SHAPES):
                continue  # no attention to time / one SDPA per each of the video's cameras
            start = time.perf_counter()
            try:
                _, run = build(name, head_dim, cameras, batch, grid, image, torch.float32, device)
            except ValueError:  # head_dim does not suit the encoding (RayRoPE: a multiple of 2 * D_c)
                continue
            prepare_ms = (time.perf_counter() - start) * 1e3
            ms = _median_ms(lambda: run(q, k, v), device, repeats)
            rows.append(
                {
                    "shape": shape,
                    "tokens": tokens,
                    "encoding": name,
                    "device": device,
                    "dtype": str(dtype).replace("torch.", ""),
                    "ms": ms,
                    "sdpa_ms": sdpa_ms,
                    "ratio_vs_sdpa": ms / sdpa_ms,
                    "prepare_ms": prepare_ms,
                }
            )
    return rows


def _print_table(rows: list[dict], columns) -> None:
    print(" | ".join(f"{c:>14s}" for c in columns))
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c)
            cells.append(f"{value:14.3g}" if isinstance(value, float) else f"{str(value):>14s}")
        print(" | ".join(cells))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--shapes", nargs="+", default=["tiny"], choices=sorted(SHAPES))
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="also check bf16 on --device against fp64 on the CPU")
    parser.add_argument("--out", default="outputs/bench_camera.json")
    args = parser.parse_args(argv)
    result = {"device": args.device, "torch": torch.__version__, "platform": platform.platform()}
    if args.device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name()
    if args.check:
        result["accuracy"] = check_accuracy(args.device)
        _print_table(result["accuracy"], ("encoding", "dtype", "rel_max_error", "sdpa_bf16_rel_max_error", "finite"))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    result["speed"] = benchmark(args.device, args.shapes, dtype, args.repeats)
    _print_table(result["speed"], ("shape", "encoding", "ms", "sdpa_ms", "ratio_vs_sdpa", "prepare_ms"))
    from mmpos._atomic import written_atomically

    out = Path(args.out)
    with written_atomically(out) as temporary:
        temporary.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
