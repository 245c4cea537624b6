"""GPU check of the timm integration and the reference DiT: CUDA (bf16 autocast, fp32) against fp64 CPU.

For each encoding, the same weights run on the CPU in fp64 (reference) and on CUDA; the table shows the
relative error ``max |out - ref| / max |ref|`` of the outputs. bf16 errors of a few 1e-3 are bf16 rounding
of activations; fp32 errors should be ~1e-6.

    pytest -m cuda tests/cuda/test_backbones_cuda.py -s
"""

from __future__ import annotations

import argparse
import copy

import pytest
import timm
import torch

from mmpos.integrations.timm import convert
from mmpos.integrations.timm.models import image_pes
from mmpos.models import DiT, make_noise_scheduler, sample_dit

pytestmark = pytest.mark.cuda


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double().cpu() - ref).abs().max() / ref.abs().max()).item()


def run_on(model, inputs, device, dtype):
    model = copy.deepcopy(model).to(device).eval()
    args = [a.to(device) if torch.is_tensor(a) else a for a in inputs]
    with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
        out = model(*args)
    return out.sample if hasattr(out, "sample") else out


def check(name, model, inputs, device) -> dict:
    ref = run_on(
        model.double(),
        [a.double() if torch.is_tensor(a) and a.is_floating_point() else a for a in inputs],
        "cpu",
        torch.float32,
    )
    model = model.float()
    return dict(
        model=name,
        fp32=relative_error(run_on(model, inputs, device, torch.float32), ref),
        bf16=relative_error(run_on(model, inputs, device, torch.bfloat16), ref),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", type=int, default=336, help="ViT input side (336 = 1.5x its 224 training size)")
    device = parser.parse_args(argv).device
    size = parser.parse_args(argv).size
    if device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available")
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here (cuDNN convs default to TF32)
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    rows = []
    images = torch.randn(4, 3, size, size)
    for pe in image_pes():
        vit = timm.create_model("vit_small_patch16_224", depth=4, dynamic_img_size=True, reg_tokens=2)
        rows.append(check(f"timm ViT-S/16 d4 {pe}", convert(vit, pe=pe), [images], device))
    latents = torch.randn(2, 4, 32, 32)
    for pe in image_pes():
        dit = DiT.from_preset("DiT-S/2", depth=4, sample_size=32, in_channels=4, num_classes=10, pe=pe)
        with torch.no_grad():
            for p in dit.parameters():
                p.add_(torch.randn_like(p) * 0.02)  # leave adaLN-Zero's zero init
        inputs = [latents, torch.tensor([10.0, 800.0]), torch.tensor([1, 7])]
        rows.append(check(f"DiT-S/2 d4 {pe}", dit, inputs, device))
    print(f"| model | rel. err fp32 ({device} vs fp64 cpu) | rel. err bf16 autocast |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['fp32']:.2e} | {r['bf16']:.2e} |")
    dit = DiT.from_preset("DiT-S/2", depth=2, sample_size=16, in_channels=4, num_classes=10, pe="rope_mixed")
    dit = dit.to(device)
    out = sample_dit(
        dit.to(torch.bfloat16),
        make_noise_scheduler("flow"),
        [0, 1],
        num_inference_steps=4,
        guidance_scale=2.0,
        generator=torch.Generator(device).manual_seed(0),
    )
    print(f"DiT bf16 flow sampling on {device}: {tuple(out.shape)}, finite={bool(torch.isfinite(out).all())}")
    worst = max(max(r["fp32"] for r in rows), 0.0)
    return 0 if worst < 1e-4 and all(r["bf16"] < 5e-2 for r in rows) else 1


def test_backbones_on_cuda(check_device):
    """fp32 within 1e-4 and bf16 autocast within 5e-2 of fp64 for every image encoding (timm ViT and DiT)."""
    assert main(["--device", check_device]) == 0
