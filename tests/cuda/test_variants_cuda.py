"""CUDA check of the learned rotary variants: bf16 and fp32 on the GPU against fp64 on the CPU.

Prints one row per encoding: max |error| of the rotated q (relative to max |q|) and of the logits
(relative to max |logit|), and whether the parameter gradients are finite. Fails if any error is
above its tolerance. Usage: ``pytest -m cuda tests/cuda/test_variants_cuda.py -s``.
"""

from __future__ import annotations

import argparse

import pytest
import torch

import mmpos
from mmpos.coords import flux_ids, grid_coords

pytestmark = pytest.mark.cuda

CASES = {  # name: (create_pe options, B, H, grid or "flux")
    "comrope_ap b=2": (dict(name="comrope_ap", block_size=2, num_prefix_tokens=1, prefix_at_centre=True), (14, 14)),
    "comrope_ap b=4": (dict(name="comrope_ap", block_size=4), (14, 14)),
    "comrope_ld b=2": (dict(name="comrope_ld", block_size=2), (14, 14)),
    "comrope_ld b=4": (dict(name="comrope_ld", block_size=4, num_prefix_tokens=1), (14, 14)),
    "comrope_ld b=8 (matrix_exp)": (dict(name="comrope_ld", block_size=8), (14, 14)),
    "liere b=4": (dict(name="liere", block_size=4), (14, 14)),
    "harope 2D axial": (dict(name="harope"), (16, 16)),
    "harope flux (16,56,56)": (dict(name="harope", base_options={"axes_dims": (16, 56, 56)}), "flux"),
}
TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 1e-4}


def build(options, head_dim, num_heads):
    options = dict(options)
    name = options.pop("name")
    if name != "harope":
        options["seed"] = 0
    pe = mmpos.create_pe(name, head_dim=head_dim, num_heads=num_heads, **options).double()
    if name == "harope":
        torch.manual_seed(0)
        with torch.no_grad():
            for p in pe.parameters():
                p.normal_(std=0.1)
    return pe


def check(label, options, grid, device) -> list[tuple]:
    head_dim = 128 if grid == "flux" else 64
    heads = 4
    coords = (
        flux_ids(16, 16, text_length=8, dtype=torch.float64)
        if grid == "flux"
        else grid_coords(grid, "normalized" if "comrope" in label or "liere" in label else "index", dtype=torch.float64)
    )
    pe = build(options, head_dim, heads)
    prefix = pe.num_prefix_tokens
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, coords.shape[0] + prefix, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(q.shape, generator=gen, dtype=torch.float64)
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        gpu = build(options, head_dim, heads).to(device, torch.float32)
        qd, kd = q.to(device, dtype).requires_grad_(True), k.to(device, dtype)
        out_q, out_k = gpu(qd, kd, coords.to(device, torch.float32))
        logits = (out_q.double() @ out_k.double().transpose(-1, -2)).cpu()
        # compare against fp64 of the same rounded inputs, so only the encoding's own error is measured
        with torch.no_grad():
            ref_q, ref_k = pe(qd.detach().double().cpu(), kd.double().cpu(), coords)
            ref_logits = ref_q @ ref_k.transpose(-1, -2)
        err_q = ((out_q.detach().double().cpu() - ref_q).abs().max() / ref_q.abs().max()).item()
        err_l = ((logits - ref_logits).abs().max() / ref_logits.abs().max()).item()
        out_q.float().square().sum().backward()
        grads_ok = all(p.grad is None or torch.isfinite(p.grad).all().item() for p in gpu.parameters())
        ok = err_q < TOLERANCE[dtype] and err_l < TOLERANCE[dtype] and grads_ok
        rows.append((label, str(dtype).replace("torch.", ""), err_q, err_l, grads_ok, ok))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = []
    for label, (options, grid) in CASES.items():
        rows += check(label, options, grid, device)
    print(f"| encoding | dtype on {device} | max err q (rel) | max err logits (rel) | grads finite | ok |")
    print("|---|---|---|---|---|---|")
    for label, dtype, err_q, err_l, grads_ok, ok in rows:
        print(f"| {label} | {dtype} | {err_q:.2e} | {err_l:.2e} | {grads_ok} | {'yes' if ok else 'NO'} |")
    return 0 if all(r[-1] for r in rows) else 1


def test_learned_variants_on_cuda(check_device):
    assert main(["--device", check_device]) == 0
