"""Device checks of the diffusers integration (``pytest -m cuda tests/cuda/test_diffusers_cuda.py -s``).

1. ``pe="native"`` is bit-identical to the stock Flux / Wan on the device, fp32 and bf16.
2. bf16 on the device against the fp64 CPU model with the same encoding: relative error of mmpos encodings,
   next to the stock bf16 model's error against stock fp64 (the floor bf16 gives).
3. One table build for repeated forwards of one shape on the device.
4. xformers (when importable) against SDPA through ``attention_backend``.
Prints a compact table; fails if a check fails.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from mmpos.integrations.diffusers import cast_keeping_pe_fp32, position_module, restore, set_pe
from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs, tiny_wan, tiny_wan_inputs

pytestmark = pytest.mark.cuda
MODELS = {"flux": (tiny_flux, tiny_flux_inputs), "wan": (tiny_wan, tiny_wan_inputs)}
NTK2 = {"type": "ntk", "factor": 2.0}
ENCODINGS = {
    "stock": None,
    "native": ("native", {}),
    "rope_axial": ("rope_axial", {}),
    "rope_mixed": ("rope_mixed", {"seed": 0}),
    "native+ntk2": ("native", {"extrapolation": NTK2}),
}


def forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def installed(make, device, dtype, encoding):
    model = make(torch.float64 if dtype == torch.float64 else torch.float32)
    if encoding is not None:
        set_pe(model, encoding[0], **encoding[1])
    model = model.to(device)
    return cast_keeping_pe_fp32(model, dtype) if encoding is not None else model.to(dtype)


def check_native_bits(device, rows):
    ok = True
    for family, (make, inputs_of) in MODELS.items():
        for dtype in (torch.float32, torch.bfloat16):
            model, inputs = make(dtype, device), inputs_of(dtype, device)
            stock = forward(model, inputs)
            set_pe(model, "native")
            same = torch.equal(forward(model, inputs), stock)
            restore(model)
            ok &= same
            rows.append(
                (f"{family} native == stock", str(dtype).split(".")[-1], "bit-identical" if same else "DIFFERS")
            )
    return ok


def check_bf16_error(device, rows):
    ok = True
    for family, (make, inputs_of) in MODELS.items():
        for name, encoding in ENCODINGS.items():
            reference = forward(installed(make, "cpu", torch.float64, encoding), inputs_of(torch.float64))
            out = forward(installed(make, device, torch.bfloat16, encoding), inputs_of(torch.bfloat16, device))
            err = ((out.double().cpu() - reference).abs().max() / reference.abs().max()).item()
            ok &= err < 0.05
            rows.append((f"{family} {name} bf16 {device} vs fp64 cpu", "rel max err", f"{err:.2e}"))
    return ok


def check_table_builds(device, rows):
    model, inputs = tiny_flux(torch.bfloat16, device), tiny_flux_inputs(torch.bfloat16, device)
    set_pe(model, "rope_axial")
    for _ in range(5):
        forward(model, inputs)
    seam = position_module(model)
    rows.append(("flux rope_axial, 5 forwards", "table builds", str(seam.table_builds)))
    return seam.table_builds == 1


def check_xformers(device, rows):
    try:
        import xformers.ops  # noqa: F401
    except Exception as err:  # not installed, or built for another torch
        rows.append(("xformers", "skipped", type(err).__name__))
        return True
    model, inputs = tiny_flux(torch.bfloat16, device), tiny_flux_inputs(torch.bfloat16, device)
    set_pe(model, "rope_axial")
    sdpa = forward(model, inputs)
    set_pe(model, "rope_axial", attention_backend="xformers")
    err = ((forward(model, inputs) - sdpa).abs().max() / sdpa.abs().max()).item()
    model.reset_attention_backend()
    rows.append(("flux rope_axial xformers vs sdpa bf16", "rel max err", f"{err:.2e}"))
    return err < 0.02


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(parser.parse_args(argv).device)
    rows = []
    checks = [
        check_native_bits(device, rows),
        check_bf16_error(device, rows),
        check_table_builds(device, rows),
        check_xformers(device, rows),
    ]
    print(f"| check ({device}) | what | result |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("ALL OK" if all(checks) else "SOME CHECKS FAILED")
    return 0 if all(checks) else 1


def test_diffusers_integration_on_cuda(check_device):
    assert main(["--device", check_device]) == 0
