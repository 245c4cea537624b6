"""CUDA correctness of the registered encodings in bf16 and of the attention backends.

    pytest -m cuda tests/cuda/test_encodings_cuda.py -s     (JSON: $MMPOS_CUDA_OUT/check_cuda.json)

1. Every registered rotary / absolute encoding (built with the demo's small options) runs on CUDA in
   bf16 and is compared with the same module in fp64 on the CPU: max error in bf16 ulps (rotary) or
   relative to the embedding scale (absolute). Encodings whose inputs are not a plain grid (cameras,
   multimodal ids) are listed as skipped; their own scripts check them.
2. The fused Triton kernel against the PyTorch path on a Flux-sized q (bf16 and fp32).
3. Attention on rotated bf16 q, k, v: PyTorch SDPA and xformers (when importable) against an fp32
   reference, relative error of the output, and time per call.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from bench_rotary import pair_norm, ulp  # benchmarks/ (on the test path)
from timing import median_seconds

import mmpos
from mmpos.coords.grids import flux_ids, grid_coords
from mmpos.demo import DEMO_OPTIONS, demo_encoding
from mmpos.ops import rotary_backend

pytestmark = pytest.mark.cuda
GRIDS = {1: (64,), 2: (8, 8), 3: (4, 4, 4)}


def check_encoding(name: str, device: str) -> dict:
    try:
        pe = demo_encoding(name)
    except (TypeError, ValueError) as error:
        return dict(encoding=name, status="skipped", reason=f"demo options do not build it: {str(error)[:100]}")
    num_axes = getattr(pe, "num_axes", 2)
    if pe.kind == "none" or num_axes not in GRIDS:
        return dict(encoding=name, status="skipped", reason=f"kind {pe.kind!r}, {num_axes} axes")
    coords = grid_coords(GRIDS[num_axes])
    length = coords.shape[0] + getattr(pe, "num_prefix_tokens", 0)
    gpu = copy.deepcopy(pe).to(device, torch.bfloat16)
    ref = copy.deepcopy(gpu).to("cpu", torch.float64)  # same (bf16-rounded) parameters, exact arithmetic
    try:
        if pe.kind == "rotary":
            heads = DEMO_OPTIONS["num_heads"]
            q = torch.randn(2, heads, length, pe.head_dim, dtype=torch.float64)
            k = torch.randn_like(q)
            gq, gk = gpu(q.to(device, torch.bfloat16), k.to(device, torch.bfloat16), coords.to(device))
            rq, rk = ref(q.bfloat16().double(), k.bfloat16().double(), coords)
            pairs = ((gq.double().cpu(), rq), (gk.double().cpu(), rk))
            err = max(((g - r).abs() / ulp(r, torch.bfloat16)).max().item() for g, r in pairs)
            rel = max(((g - r).abs().max() / r.abs().max()).item() for g, r in pairs)
            return dict(encoding=name, status="ok", max_err_bf16_ulp=err, max_rel_err=rel)
        x = torch.randn(2, length, pe.embed_dim, dtype=torch.float64)
        out = gpu(x.to(device, torch.bfloat16), coords.to(device)).double().cpu()
        exact = ref(x.bfloat16().double(), coords)
        return dict(encoding=name, status="ok", max_rel_err=((out - exact).abs().max() / exact.abs().max()).item())
    except (TypeError, ValueError) as error:  # inputs other than a plain grid: checked by the encoding's own script
        return dict(encoding=name, status="skipped", reason=str(error)[:120])
    except Exception as error:  # noqa: BLE001 - a failure here is a finding, reported with the others
        return dict(encoding=name, status="FAILED", reason=f"{type(error).__name__}: {str(error)[:160]}")


def check_kernel(device: str) -> list[dict]:
    pe = mmpos.create_pe("rope_axial", head_dim=128, axes_dims=(16, 56, 56))
    coords = flux_ids(64, 64, text_length=512).to(device)
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(1, 24, coords.shape[0], 128, device=device, dtype=dtype)
        exact = pe.rotate(x.double(), pe.table(coords, torch.float64))
        fused = pe.rotate(x, pe.table(coords, dtype))
        with rotary_backend("torch"):
            plain = pe.rotate(x, pe.table(coords, dtype))
        spacing, norm_spacing = ulp(exact, dtype), ulp(pair_norm(x.double()), dtype)
        row = dict(dtype=str(dtype).removeprefix("torch."), identical=torch.equal(fused, plain))
        for method, out in (("fused", fused), ("torch", plain)):
            error = (out.double() - exact).abs()
            row[f"{method}_max_ulp"] = (error / spacing).max().item()
            row[f"{method}_max_ulp_of_pair_norm"] = (error / norm_spacing).max().item()
        rows.append(row)
    return rows


def time_ms(fn, repeats: int = 20) -> float:
    """Median milliseconds of ``fn()`` (CUDA synchronised when available)."""
    return median_seconds(fn, "cuda" if torch.cuda.is_available() else "cpu", repeats) * 1e3


def check_attention(device: str) -> list[dict]:
    pe = mmpos.create_pe("rope_axial", head_dim=128, axes_dims=(16, 56, 56))
    coords = flux_ids(64, 64, text_length=512).to(device)
    shape = (1, 24, coords.shape[0], 128)
    q, k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16) for _ in range(3))
    q, k = pe(q, k, coords)
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    backends = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v)}
    try:
        import xformers.ops as xops

        qx, kx, vx = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # xformers takes [B, L, H, D]
        backends["xformers"] = lambda: xops.memory_efficient_attention(qx, kx, vx).transpose(1, 2)
    except Exception as error:  # noqa: BLE001 - any import or kernel failure is reported, not fatal
        print(f"xformers unavailable: {type(error).__name__}: {str(error)[:160]}")
    rows = []
    for name, fn in backends.items():
        try:
            out = fn()
            rel = ((out.float() - reference).norm() / reference.norm()).item()
            rows.append(dict(backend=name, rel_err_vs_fp32=rel, ms=time_ms(fn)))
        except Exception as error:  # noqa: BLE001
            rows.append(dict(backend=name, error=f"{type(error).__name__}: {str(error)[:160]}"))
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("outputs/check_cuda.json"))
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu (dry run)"
    print(f"torch {torch.__version__} on {name}")
    results = dict(
        encodings=[check_encoding(name, args.device) for name in mmpos.list_pes()],
        kernel=check_kernel(args.device),
        attention=check_attention(args.device),
    )
    for section, rows in results.items():
        print(f"== {section}")
        for row in rows:
            print("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    return results


def _out_dir(tmp_path) -> Path:
    """Where the JSON results go: ``$MMPOS_CUDA_OUT`` (set by scripts/gpu_checks.sh) or the test's folder."""
    return Path(os.environ.get("MMPOS_CUDA_OUT", tmp_path))


def test_encodings_kernel_and_attention_on_cuda(tmp_path, check_device):
    """Nothing fails; the kernel and the PyTorch path round bf16 once (<= 1 ulp of the pair norm); SDPA's bf16
    output is within 2e-2 of fp32 attention."""
    results = main(["--device", check_device, "--out", str(_out_dir(tmp_path) / "check_cuda.json")])
    assert [row["encoding"] for row in results["encodings"] if row["status"] == "FAILED"] == []
    (bf16,) = [row for row in results["kernel"] if row["dtype"] == "bfloat16"]
    assert bf16["fused_max_ulp_of_pair_norm"] <= 1.0 and bf16["torch_max_ulp_of_pair_norm"] <= 1.0
    (sdpa,) = [row for row in results["attention"] if row["backend"] == "sdpa"]
    assert sdpa["rel_err_vs_fp32"] < 2e-2
